"""Answers given before: a request whose whole prompt was served before
starts its draft with the answer given then.

Why: the n-gram stores find an answer by the text just before it, and only
the last ``max_match_len`` tokens of a prompt are read.  Where a prompt ends
in boilerplate (an agent's prompt ends in the same shell prompt and chat
template after every tool output), the end of the prompt matches every
earlier turn and every other task alike, and the answer given to this very
conversation before (a retried task, a regenerated answer, a harness running
a benchmark again) is one occurrence among hundreds, often beyond the chains'
walk.  A fingerprint of the whole prompt tells them apart at once.

Only the answer's first ``keep`` tokens are held: past them the request's
own output is long enough for the stores to find the earlier answer by its
text (the answer is in the scope's history), and that also follows a rerun
that parts from it.  Kept per scope (a request never sees another scope's
answers) in a bounded LRU; not saved with the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

import numpy as np

# How far back a fingerprint reads a prompt (with its length): conversations
# that share their last this many tokens and their length are the same.
FINGERPRINT_TOKENS = 8192


def fingerprint(prompt: np.ndarray) -> int:
    """A prompt's identity for :class:`AnswerMemo` (``prompt``: int32 ids)."""
    return hash((len(prompt), prompt[-FINGERPRINT_TOKENS:].tobytes()))


class AnswerMemo:
    """(scope key, prompt fingerprint) -> its latest answer's first ``keep``
    tokens, behind the prompt's last token (what the answer's first token
    follows, as a draft checks: see :func:`follow`)."""

    def __init__(self, entries: int, keep: int = 64):
        self.entries = entries
        self.keep = keep
        self._answers: OrderedDict = OrderedDict()
        self.hits = 0  # requests that found an earlier answer

    def recall(self, scope: Any, print_: int) -> Optional[np.ndarray]:
        answer = self._answers.get((scope, print_))
        if answer is not None:
            self._answers.move_to_end((scope, print_))
            self.hits += 1
        return answer

    def remember(self, scope: Any, print_: int, answer: np.ndarray) -> None:
        if self.entries <= 0 or len(answer) < 2:
            return
        self._answers[(scope, print_)] = np.array(answer[: self.keep + 1], dtype=np.int32)
        self._answers.move_to_end((scope, print_))
        while len(self._answers) > self.entries:
            self._answers.popitem(last=False)

    def clear(self) -> None:
        self._answers.clear()

    def __len__(self) -> int:
        return len(self._answers)


# Committed tokens a context may hold beyond what the cache was given (an
# overlapped step's, see the worker): where its output is looked for.
PENDING_SLACK = 16


def follow(answer: np.ndarray, context: Any, given: int, budget: int) -> Optional[list]:
    """The earlier answer's next ``budget`` tokens after ``context`` (the
    tail of prompt + output, as drafts read it), or None once the output has
    parted from the answer or passed its end.  ``answer``: the prompt's last
    token, then the answer (as remembered).  ``given``: the output tokens
    the cache holds; the context may end in a few more (``PENDING_SLACK``).
    The answer is followed where the context ends in its first k tokens
    (after the prompt's last one), the largest such k from ``given`` on."""
    n = len(answer) - 1
    if given >= n:
        return None
    if len(context) == 0:
        return []
    last = int(context[-1])
    for k in range(min(given + PENDING_SLACK, n - 1, len(context) - 1), given - 1, -1):
        if answer[k] == last and np.array_equal(np.asarray(context[-k - 1:], dtype=np.int64), answer[:k + 1]):
            return answer[k + 1: k + 1 + budget].tolist()
    return None
