"""Where a draft's paths can come from: the checks that tie a draft to the
text it was drafted from (the trie tests' histories, and the isolation tests'
own stream plus scope history)."""

from __future__ import annotations


def leaf_paths(tokens, parents) -> list[list[int]]:
    """The draft tree's root-to-leaf token paths."""
    has_child = set(parents)
    paths = []
    for i in range(len(tokens)):
        if i in has_child:
            continue
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        paths.append(path[::-1])
    return paths


def _joined(stream) -> str:
    return "," + ",".join(map(str, stream)) + ","


def check_paths_in_history(draft, context, streams, wildcard_tokens: int = 2) -> None:
    """Every root path of the draft continues an occurrence of the context's
    last token somewhere in what was fed (a request's prompt + outputs), or
    (a draft past tokens that matched nothing, or past the last token at
    ``wildcard_weight``) an occurrence of the token ``skip`` <=
    ``wildcard_tokens`` places before it, ``skip`` tokens on."""
    if not len(draft[0]):
        return
    last = int(context[-1])
    haystacks = [_joined(s) for s in streams]
    for path in leaf_paths(*draft):
        needle = _joined([last] + path)
        if any(needle in h for h in haystacks):
            continue
        assert any(
            any(h[i] == int(context[-1 - skip]) and h[i + 1 + skip: i + 1 + skip + len(path)] == path
                for h in streams for i in range(len(h) - skip - len(path)))
            for skip in range(1, min(wildcard_tokens, len(context) - 1) + 1)
        ), f"draft path {path} after {last} (never seen) continues no occurrence of the tokens before it"
