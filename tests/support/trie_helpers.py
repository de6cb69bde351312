"""What the trie's tests share: a cache opened from one set of keywords
(options and tuning alike), inputs in every accepted form, the structural
invariants of a draft, and a replay that holds every draft to the reference
model (``trie_reference.py``).

No test of the trie measures time; throughput and latency are for
``benchmarks/bench_trie.py``.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck

REPO = Path(__file__).resolve().parents[2]

from lookahead import Draft, LookaheadCache, LookaheadConfig  # noqa: E402
from lookahead.trie._tuning import TUNING_FIELDS, DraftTuning  # noqa: E402
from trie_reference import RefCache  # noqa: E402

SMALL_MEMORY = 1 << 16  # the smallest shared history: 1024 tokens with the default orders
PROPERTY_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def configure(**knobs) -> tuple[LookaheadConfig, DraftTuning]:
    """Options and tuning from one set of keywords (tests vary both)."""
    tuning = {name: knobs.pop(name) for name in list(knobs) if name in TUNING_FIELDS}
    return LookaheadConfig(**knobs), DraftTuning(**tuning)


@contextlib.contextmanager
def open_cache(config: LookaheadConfig | None = None, tuning: DraftTuning | None = None, **knobs):
    """A cache of ``config`` and ``tuning``, or of ``configure(**knobs)``."""
    if config is None:
        config, from_knobs = configure(**knobs)
        assert tuning is None or from_knobs == DraftTuning(), "the tuning given twice"
        tuning = from_knobs if tuning is None else tuning
    cache = LookaheadCache(config, tuning=tuning)
    try:
        yield cache
    finally:
        cache.close()


def as_input(tokens, kind: str):
    """The same ids as a list, a tuple or a numpy array."""
    if kind == "list":
        return list(tokens)
    if kind == "tuple":
        return tuple(tokens)
    return np.asarray(tokens, dtype=np.int32 if kind == "int32" else np.int64)


def check_draft(draft, budget: int, one_branch: bool) -> None:
    """Structural invariants of every draft."""
    assert type(draft) is Draft, type(draft)  # built natively, from any thread's drafter
    tokens, parents = list(draft[0]), list(draft[1])
    assert len(tokens) == len(parents) <= budget
    seen = set()
    for i, (tok, parent) in enumerate(zip(tokens, parents)):
        assert type(tok) is int and tok >= 0, tokens
        assert type(parent) is int and -1 <= parent < i, parents
        assert (parent, tok) not in seen, f"two siblings with token {tok}: {tokens} {parents}"
        seen.add((parent, tok))
    if one_branch:
        assert parents == list(range(-1, len(tokens) - 1))
    # One score per node, best first, summing to the expectation: a prefix
    # is the best draft of its length (what a batch trims its drafts to).
    scores = list(draft.scores)
    assert len(scores) == len(tokens), (scores, tokens)
    assert all(0.0 <= b <= a <= 1.0 for a, b in zip([1.0] + scores, scores)), scores
    assert math.isclose(sum(scores), draft.expected, rel_tol=1e-9, abs_tol=1e-12), (scores, draft.expected)


def replay_against_reference(cfg: LookaheadConfig, requests, seed: int, draft_every: int = 1,
                              tuning: DraftTuning | None = None) -> tuple[int, int]:
    """Serve ``requests`` (prompt, response) one at a time like the replay,
    feeding 1-3 response tokens per step, and compare every draft."""
    rng = random.Random(seed)
    ref = RefCache(cfg, tuning)
    compared = nonempty = 0
    with open_cache(cfg, tuning) as cache:
        for rid, (prompt, response) in enumerate(requests):
            cache.put_prompt(rid, prompt)
            ref.put_prompt(rid, prompt)
            stream = np.concatenate([np.asarray(prompt, np.int64), np.asarray(response, np.int64)])
            i, plen = 0, len(prompt)
            while i < len(response):
                if compared % draft_every == 0:
                    budget, one_branch = rng.randint(1, 12), rng.random() < 0.3
                    cache.synchronize()
                    d = cache.draft(rid, stream[: plen + i], budget, one_branch)
                    assert (d.tokens, d.parents) == ref.draft(rid, stream[: plen + i].tolist(), budget, one_branch)[:2]
                    nonempty += bool(d.tokens)
                compared += 1
                step = rng.randint(1, 3)
                cache.put_output(rid, stream[plen + i: plen + i + step])
                ref.put_output(rid, stream[plen + i: plen + i + step].tolist())
                i += step
            cache.finish(rid)
            ref.finish(rid)
        cache.synchronize()
        stats = cache.stats()
    return nonempty, stats["shared_tokens_seen"]
