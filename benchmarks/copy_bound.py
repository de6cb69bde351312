"""Hindsight bounds of copying drafters on recorded outputs.

NGRAM, SuffixDecoding and LOOKAHEAD all draft by copying: they find where
the context's last tokens occurred before (in the request's prompt and
output so far, a history, a corpus) and propose what followed there.

**A contiguous single-source copy bound** (``copy_bound_steps``): on a
recorded output, the best such draft at each step is the one continuation,
among *every* occurrence of the context's last token in the sources, that
matches the output furthest, knowing the output (hindsight). Replaying the
output step by step with that draft (at most ``width - 1`` tokens, plus the
token every step commits) gives the acceptance length no drafter can beat
whose every draft is one contiguous copy from one place. LOOKAHEAD can beat
it: its drafts re-anchor (a copy continued past an edit, a branch joined
from another occurrence) and it drafts past a token never seen before.

**The re-anchoring bound** (``reanchor=True``): a draft may switch source at
every token, as long as each drafted token followed its predecessor
somewhere in the sources or the text so far (the pair was seen). This
bounds every drafter that only proposes seen continuations, LOOKAHEAD's
re-anchored copies included; only a draft past a never-seen token can pass
it.

Steps are counted as the benchmarks count them (``bench_workloads``): the
prefill is a model step and produces the first output token alone, no draft
verified (``prefill=True``, the default), so AL = tokens / (1 + decode
steps) for every decoding. ``prefill=False`` drafts the first token too, as
the model-free replay (``lookahead.replay``) counts.

It answers "how much is left?" before tuning a drafter: where a target is
close to the bound, the text itself, not the drafter, stands in the way.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence


def _follows(src: list, j: int, want: list) -> int:
    """How many tokens of ``want`` follow position ``j`` of ``src``."""
    k = 0
    while k < len(want) and j + 1 + k < len(src) and src[j + 1 + k] == want[k]:
        k += 1
    return k


def seen_chain(pairs: set, prev: int, want: Sequence[int]) -> int:
    """How many tokens of ``want`` follow ``prev`` through pairs in ``pairs``."""
    n = 0
    for t in want:
        if (prev, t) not in pairs:
            break
        n, prev = n + 1, t
    return n


def copy_bound_steps(sources: Sequence[Sequence[int]], prompt: Sequence[int], output: Sequence[int],
                     width: int = 8, prefill: bool = True, reanchor: bool = False) -> int:
    """Model steps to commit ``output`` when every step drafts the best
    continuation of any occurrence of the context's last token in
    ``sources``, ``prompt`` or the output so far (at most ``width - 1``
    tokens); each step commits the accepted draft tokens plus one. With
    ``prefill`` the first token takes a step of its own (the prefill's);
    with ``reanchor`` a draft may be any chain of seen token pairs."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    budget = width - 1
    fixed = [list(s) for s in sources]
    where = defaultdict(list)  # token -> (source, position) in the fixed sources
    pairs = set()  # (token, next token) seen in the fixed sources
    for si, s in enumerate(fixed):
        for j, t in enumerate(s):
            where[t].append((si, j))
        pairs.update(zip(s, s[1:]))
    stream = list(prompt)  # the prompt, then the output as it is committed
    own = defaultdict(list)
    for j, t in enumerate(stream):
        own[t].append(j)
    pairs.update(zip(stream, stream[1:]))
    out = list(output)
    steps = i = 0

    def commit(tokens):
        for t in tokens:
            if stream:
                pairs.add((stream[-1], t))
            own[t].append(len(stream))
            stream.append(t)

    if prefill and out:
        commit(out[:1])
        i = steps = 1
    while i < len(out):
        last, best = stream[-1] if stream else None, 0
        want = out[i: i + budget]
        if last is not None and reanchor:
            best = seen_chain(pairs, last, want)
        elif last is not None:
            for si, j in where.get(last, ()):
                best = max(best, _follows(fixed[si], j, want))
                if best == budget:
                    break
            if best < budget:
                for j in own.get(last, ()):
                    best = max(best, _follows(stream, j, want))
        advance = min(best + 1, len(out) - i)
        commit(out[i: i + advance])
        i += advance
        steps += 1
    return steps
