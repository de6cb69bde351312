"""The most a copying drafter could accept on recorded outputs: a hindsight bound.

NGRAM, SuffixDecoding and LOOKAHEAD all draft by copying: they find where
the context's last tokens occurred before (in the request's prompt and
output so far, a history, a corpus) and propose what followed there.  On a
recorded output, the best such draft at each step is the continuation, among
*every* occurrence of the context's last token in the sources, that matches
the output furthest, knowing the output (hindsight).  Replaying the output
step by step with that draft (at most ``width - 1`` tokens, plus the token
every step commits) gives the acceptance length no drafter confined to those
sources can beat by copying alone.

It answers "how much is left?" before tuning a drafter: where a target is
close to this bound, the text itself, not the drafter, stands in the way.
It is not strict for LOOKAHEAD, whose rarely used fall-backs (a draft past a
token never seen before, a copy re-anchored past an edit) are not copies of
an occurrence of the last token; in the runs measured it stayed above them.
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


def copy_bound_steps(sources: Sequence[Sequence[int]], prompt: Sequence[int], output: Sequence[int],
                     width: int = 8) -> int:
    """Model steps to commit ``output`` when every step drafts the best
    continuation of any occurrence of the context's last token in
    ``sources``, ``prompt`` or the output so far (at most ``width - 1``
    tokens); each step commits the accepted draft tokens plus one."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    budget = width - 1
    fixed = [list(s) for s in sources]
    where = defaultdict(list)  # token -> (source, position) in the fixed sources
    for si, s in enumerate(fixed):
        for j, t in enumerate(s):
            where[t].append((si, j))
    stream = list(prompt)  # the prompt, then the output as it is committed
    own = defaultdict(list)
    for j, t in enumerate(stream):
        own[t].append(j)
    out = list(output)
    steps = i = 0
    while i < len(out):
        last, best = stream[-1] if stream else None, 0
        want = out[i: i + budget]
        if last is not None:
            for si, j in where.get(last, ()):
                best = max(best, _follows(fixed[si], j, want))
                if best == budget:
                    break
            if best < budget:
                for j in own.get(last, ()):
                    best = max(best, _follows(stream, j, want))
        advance = min(best + 1, len(out) - i)
        for t in out[i: i + advance]:
            own[t].append(len(stream))
            stream.append(t)
        i += advance
        steps += 1
    return steps
