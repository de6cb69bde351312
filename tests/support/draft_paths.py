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


def unexplained_paths(draft, context, streams, wildcard_tokens: int = 2) -> list[list[int]]:
    """The root paths of the draft that continue no occurrence of the
    context's last token in ``streams`` (what was fed: a request's prompt +
    outputs) and are no draft past tokens that matched nothing (or past the
    last token at ``wildcard_weight``) either: an occurrence of the token
    ``skip`` <= ``wildcard_tokens`` places before it, ``skip`` tokens on."""
    if not len(draft[0]):
        return []
    last = int(context[-1])
    haystacks = [_joined(s) for s in streams]
    out = []
    for path in leaf_paths(draft[0], draft[1]):
        needle = _joined([last] + path)
        if any(needle in h for h in haystacks):
            continue
        if not any(
            any(h[i] == int(context[-1 - skip]) and h[i + 1 + skip: i + 1 + skip + len(path)] == path
                for h in streams for i in range(len(h) - skip - len(path)))
            for skip in range(1, min(wildcard_tokens, len(context) - 1) + 1)
        ):
            out.append(path)
    return out


def check_paths_in_history(draft, context, streams, wildcard_tokens: int = 2) -> None:
    """Every root path of the draft comes from ``streams`` (see unexplained_paths)."""
    bad = unexplained_paths(draft, context, streams, wildcard_tokens)
    assert not bad, f"draft paths {bad} after {int(context[-1])} continue no occurrence in what was fed"


def drafts_with_own_streams(records, rid, prompt) -> list[tuple[dict, list]]:
    """The draft log's records (``LOOKAHEAD_DRAFT_LOG``) of request ``rid``,
    each with the request's own stream (its prompt and output) as it was
    when drafted, rebuilt from the records' contexts: a context is the
    stream's last tokens, and the output grows by a few tokens a step."""
    own, out = [int(t) for t in prompt], []
    for rec in records:
        if rec["rid"] != rid:
            continue
        ctx, new = rec["context"], rec["stream"] - len(own)
        assert 0 <= new <= len(ctx), (rid, rec["stream"], len(own))
        own += ctx[len(ctx) - new:]
        assert own[len(own) - len(ctx):] == ctx, f"{rid}: a context is not its stream's tail"
        out.append((rec, list(own)))
    return out
