"""Bad inputs are rejected before anything changes, with a message that names them.

Token ids of every wrong kind and range, budgets, unknown and duplicate
requests, and out-of-range options and tuning.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

from lookahead import LookaheadCache, LookaheadConfig  # noqa: E402
from lookahead.trie._tuning import TUNING_FIELDS, DraftTuning  # noqa: E402
from trie_helpers import check_draft, open_cache  # noqa: E402


VOCAB = 100

BAD_TOKENS = [
    pytest.param([1, 2, -1], ValueError, r"token id -1 at index 2", id="negative"),
    pytest.param([1, VOCAB], ValueError, rf"token id {VOCAB} at index 1", id="vocab_size"),
    pytest.param([1, 2.0], TypeError, r"integers", id="float"),
    pytest.param([1, "2"], TypeError, r"integers", id="string-item"),
    pytest.param([1, [2, 3]], (TypeError, ValueError), r"integer|1-D", id="nested"),
    pytest.param("1 2 3", TypeError, r"sequence of integer token ids", id="string"),
    pytest.param(None, TypeError, r"token ids", id="none"),
    pytest.param(np.array([1.0, 2.0], np.float32), TypeError, r"dtype float32", id="float32"),
    pytest.param(np.array([True, False]), TypeError, r"dtype bool", id="bool-array"),
    pytest.param(np.array([[1, 2], [3, 4]], np.int64), ValueError, r"1-D", id="2d"),
    pytest.param(np.array([1, -3], np.int32), ValueError, r"token id -3", id="negative-int32"),
    pytest.param(np.array([1, VOCAB + 5], np.int64), ValueError, rf"token id {VOCAB + 5}", id="oversized-int64"),
]

BAD_TOKENS_NO_VOCAB = [
    pytest.param([1, 2**31], ValueError, r"token id 2147483648", id="int32-max+1"),
    pytest.param([2**40], ValueError, r"token id 1099511627776", id="2**40"),
    pytest.param(np.array([2**31], np.int64), ValueError, r"token id 2147483648", id="int64-array"),
]


@contextlib.contextmanager
def _ready_cache(**kw):
    """A cache with a finished history and one live request 'r'."""
    with open_cache(max_memory_bytes=1 << 16, **kw) as cache:
        rng = random.Random(0)
        for rid in range(5):
            cache.put_prompt(rid, [rng.randrange(20) for _ in range(40)])
            cache.put_output(rid, [rng.randrange(20) for _ in range(40)])
            cache.finish(rid)
        cache.put_prompt("r", [rng.randrange(20) for _ in range(60)])
        cache.synchronize()
        yield cache


def _snapshot(cache) -> tuple:
    cache.synchronize()
    ctx = [3, 4, 5, 6, 7]
    stats = cache.stats()
    keep = {k: stats[k] for k in ("prompts", "prompt_tokens", "output_tokens", "finished", "active_requests",
                                  "local_tokens", "shared_tokens_seen", "failed_inserts")}
    return cache.draft("r", ctx, 8), cache.draft("r", ctx, 8, one_branch=True), keep


def _expect_rejected(cache, call, exc, pattern):
    before = _snapshot(cache)
    with pytest.raises(exc, match=pattern):
        call()
    assert _snapshot(cache) == before, "a rejected call changed the cache"


@pytest.mark.parametrize("bad, exc, pattern", BAD_TOKENS)
def test_bad_tokens_rejected_and_cache_intact(bad, exc, pattern):
    with _ready_cache(vocab_size=VOCAB) as cache:
        _expect_rejected(cache, lambda: cache.put_prompt("new", bad), exc, pattern)
        assert "new" not in cache
        _expect_rejected(cache, lambda: cache.put_output("r", bad), exc, pattern)
        if isinstance(bad, list) and len(bad) > 1:  # only a context's tail is read: put the bad id last
            shifted = pattern.replace("index 2", "index 4").replace("index 1", "index 3")
            _expect_rejected(cache, lambda: cache.draft("r", [5, 6] + bad, 4), exc, shifted)
        else:
            _expect_rejected(cache, lambda: cache.draft("r", bad, 4), exc, pattern)
        _expect_rejected(cache, lambda: cache.batch_draft(["r"], [bad], 4), exc, None)
        # A good call afterwards works.
        cache.put_prompt("new", [1, 2, 3])
        cache.put_output("r", [1, 2, 3])
        cache.synchronize()
        check_draft(cache.draft("r", [1, 2, 3], 4), 4, False)


def test_bool_ids_rejected_by_put_output_and_draft():
    with _ready_cache(vocab_size=VOCAB) as cache:
        _expect_rejected(cache, lambda: cache.put_output("r", [1, True]), TypeError, "got bool at index 1")
        _expect_rejected(cache, lambda: cache.draft("r", [1, False], 4), TypeError, "got bool at index 1")


def test_bool_ids_rejected_by_put_prompt():
    with _ready_cache(vocab_size=VOCAB) as cache:
        _expect_rejected(cache, lambda: cache.put_prompt("new", [1, True]), TypeError, "bool")


@pytest.mark.parametrize("bad, exc, pattern", BAD_TOKENS_NO_VOCAB)
def test_ids_beyond_int32_rejected(bad, exc, pattern):
    with _ready_cache() as cache:
        _expect_rejected(cache, lambda: cache.put_prompt("new", bad), exc, pattern)
        _expect_rejected(cache, lambda: cache.put_output("r", bad), exc, pattern)
        _expect_rejected(cache, lambda: cache.draft("r", bad, 4), exc, pattern)


@pytest.mark.parametrize("where", ["put_output", "draft"])
def test_huge_python_ints_rejected(where):
    with _ready_cache() as cache:
        call = (lambda: cache.put_output("r", [1, 2**64])) if where == "put_output" else \
            (lambda: cache.draft("r", [1, 2**64], 4))
        _expect_rejected(cache, call, (ValueError, TypeError), None)


def test_unknown_and_duplicate_requests():
    with _ready_cache() as cache:
        for call in (lambda: cache.put_output("nope", [1]), lambda: cache.draft("nope", [1, 2], 4),
                     lambda: cache.finish("nope"), lambda: cache.batch_draft(["r", "nope"], [[1], [2]], 4),
                     lambda: cache.finish(0)):  # 0 finished already
            _expect_rejected(cache, call, ValueError, "unknown request")
        _expect_rejected(cache, lambda: cache.put_prompt("r", [9, 9, 9]), ValueError, "already has a prompt")
        _expect_rejected(cache, lambda: cache.batch_draft(["r"], [[1], [2]], 4), ValueError, "1 rids but 2 contexts")


@pytest.mark.parametrize("budget, exc, pattern", [
    (-1, ValueError, "budget must be >= 0"),
    (np.int64(-3), ValueError, "budget must be >= 0"),
    (1.5, TypeError, "budget must be an integer"),
    (2.0, TypeError, "budget must be an integer"),
    ("4", TypeError, "budget must be an integer"),
    (None, TypeError, "budget must be an integer"),
    (True, TypeError, "budget must be an integer"),
])
def test_bad_budget(budget, exc, pattern):
    with _ready_cache() as cache:
        _expect_rejected(cache, lambda: cache.draft("r", [1, 2, 3], budget), exc, pattern)
        _expect_rejected(cache, lambda: cache.batch_draft(["r"], [[1, 2, 3]], budget), exc, pattern)
        assert cache.draft("r", [1, 2, 3], 0) == ([], [], 0.0, [])
        assert cache.draft("r", [1, 2, 3], np.int64(3)) == cache.draft("r", [1, 2, 3], 3)


def test_huge_budget_is_a_clean_error_or_works():
    with _ready_cache() as cache:
        try:
            d = cache.draft("r", [1, 2, 3], 2**31)
        except (ValueError, TypeError):
            return
        check_draft(d, 2**31, False)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"max_memory_bytes": 0}, "max_memory_bytes"),
    ({"max_memory_bytes": 1000}, "at least 64 KiB"),
    ({"max_memory_bytes": 1.5e9}, "max_memory_bytes"),
    ({"max_memory_bytes": True}, "max_memory_bytes"),
    ({"orders": ()}, "orders"),
    ({"orders": (0, 1)}, "orders"),
    ({"orders": (2, 1)}, "orders"),
    ({"orders": (1, 1)}, "orders"),
    ({"orders": (1, 2.5)}, "orders"),
    ({"orders": tuple(range(1, 10))}, "at most 8"),
    ({"max_match_len": 0}, "max_match_len"),
    ({"max_walk": -1}, "max_walk"),
    ({"max_candidates": 0}, "max_candidates"),
    ({"enough_candidates": 0}, "enough_candidates"),
    ({"min_match_len": 0}, "min_match_len"),
    ({"flush_tokens": 0}, "flush_tokens"),
    ({"match_exponent": -1.0}, "match_exponent"),
    ({"local_weight": 0.0}, "local_weight"),
    ({"chain_local_weight": -1.0}, "chain_local_weight"),
    ({"copy_boost": -1.0}, "copy_boost"),
    ({"copy_boost": float("nan")}, "copy_boost"),
    ({"wildcard_tokens": -1}, "wildcard_tokens"),
    ({"mismatch_weight": -0.5}, "mismatch_weight"),
    ({"wildcard_weight": -1.0}, "wildcard_weight"),
    ({"wildcard_pace": float("nan")}, "wildcard_pace"),
    ({"wildcard_walk": 0}, "wildcard_walk"),
    ({"output_weight": 0.0}, "output_weight"),
    ({"output_weight": float("inf")}, "output_weight"),
    ({"output_weight": float("nan")}, "output_weight"),
    ({"mismatch_weight": float("nan")}, "mismatch_weight"),
    ({"wildcard_tokens": 1.5}, "wildcard_tokens"),
    ({"confidence": -0.5}, "confidence"),
    ({"share_prompt_tail": -1}, "share_prompt_tail"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"vocab_size": 10.5}, "vocab_size"),
])
def test_bad_config_values(kwargs, pattern):
    """Each option is checked by the structure that holds it: the config,
    or the tuning (which the cache takes whole)."""
    owner = DraftTuning if set(kwargs) <= TUNING_FIELDS else LookaheadConfig
    with pytest.raises(ValueError, match=pattern):
        owner(**kwargs)
    if owner is LookaheadConfig:
        with pytest.raises(ValueError, match=pattern):
            LookaheadCache(**kwargs)


def test_tuning_is_not_an_option():
    """The ranking weights are not options of the cache: they come as one
    ``DraftTuning``."""
    with pytest.raises(TypeError, match="copy_boost"):
        LookaheadCache(copy_boost=1.0)
    with pytest.raises(TypeError, match="DraftTuning"):
        LookaheadCache(tuning={"copy_boost": 1.0})


def test_memory_budget_beyond_this_machine_is_rejected():
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with pytest.raises(ValueError, match="more than this machine's memory"):
        LookaheadConfig(max_memory_bytes=2 * physical)
    with pytest.raises(ValueError, match="more than this machine's memory"):
        LookaheadCache(max_memory_bytes=physical + 1)


def test_unknown_config_keyword():
    with pytest.raises(TypeError, match="no_such_knob"):
        LookaheadCache(no_such_knob=1)
