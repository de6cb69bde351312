"""A live request in the cache: its store, its scope, and what of it is shared.

Kept apart from ``LookaheadCache`` so that the cache module reads as the
request lifecycle; nothing here is public.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from lookahead.trie._store import TokenStore
from lookahead.trie.answers import fingerprint
from lookahead.trie.config import LookaheadConfig


@dataclass
class Request:
    store: TokenStore  # the prompt, then the output as it is accepted
    prompt_len: int
    shared_upto: int  # store position up to which the output is in the shared history
    scope: Any = None  # its scope's key (PRIVATE: it shares nothing)
    corpora: Optional[frozenset] = None  # the corpora it chose (None: all it may see)
    # Its shared stores besides its history (the corpora it drafts from), as of corpus generation ``view_gen``.
    view: tuple = ()
    view_gen: int = -1
    tail: int = 0  # prompt tokens shared before its output (see share_tail)
    print_: int = 0  # its prompt's fingerprint (lookahead.trie.answers)
    answer: Optional[np.ndarray] = None  # the answer its prompt got before, while its output follows it
    group: Optional[list] = None  # the live requests of its scope with the same prompt, itself included


def share_tail(prompt: np.ndarray, config: LookaheadConfig) -> int:
    """How many of the prompt's last tokens go into the shared history
    before its output: ``share_prompt_tail``, or ``share_tail_margin`` past
    the longest suffix of the prompt that also occurs earlier in it, at most
    ``max_match_len``."""
    tail = config.share_prompt_tail
    n = len(prompt)
    if config.share_tail_margin == 0 or n < 2:
        return tail
    limit = max(0, min(n - 1, config.max_match_len - config.share_tail_margin))
    # Ends of the earlier occurrences of the prompt's last k tokens, k = 1, 2, ...
    ends = np.flatnonzero(prompt[:-1] == prompt[-1])
    k = 0
    while ends.size and k < limit:
        k += 1
        ends = ends[ends >= k]
        ends = ends[prompt[ends - k] == prompt[n - 1 - k]]
    return max(tail, min(k + config.share_tail_margin, config.max_match_len))


def finished_elsewhere(prompt: np.ndarray, output: np.ndarray, scope: Any, config: LookaheadConfig,
                       remembers: bool) -> Request:
    """A request another replica served, as the cache shares a finished one:
    the prompt's tail then the output, in a store that is a copy source
    only (never indexed)."""
    tail = share_tail(prompt, config)
    head = prompt[max(0, len(prompt) - max(tail, 1)):]
    store = TokenStore(len(head) + len(output) + 16, False, config.orders)
    store.append_tokens(np.concatenate([head, output]), False)
    return Request(store, len(head), len(head), scope, tail=min(tail, len(head)),
                   print_=fingerprint(prompt) if remembers and len(prompt) else 0)
