"""Inserts never block drafting, and the insert thread's lifetime is safe.

Drafts return while a huge prompt is indexed; indexing progresses under
back-to-back drafts; the count of running drafts stays balanced; a store
freed while its insert is queued; the thread restarting after ``close``.
Functional checks only: nothing here is timed.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

from lookahead import LookaheadCache  # noqa: E402
from trie_helpers import check_draft, open_cache  # noqa: E402


def test_inserts_never_block_drafting():
    """While a huge prompt is being indexed in the background, drafts (for
    another request, and for the request being indexed) still return; after
    ``synchronize()`` the prompt is fully indexed."""
    marker, tail = list(range(1, 9)), [9, 10, 11, 12]
    rng = np.random.default_rng(1)
    with open_cache(max_memory_bytes=1 << 20) as cache:
        cache.put_prompt("small", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
        cache.synchronize()
        observed = 0
        for size in (1 << 20, 1 << 22):
            big = rng.integers(1000, 50000, size=size).astype(np.int32)
            big[size - 100: size - 88] = marker + tail
            rid = ("big", size)
            cache.put_prompt(rid, big)
            store = cache._requests[rid].store
            while store.indexed == 0 and cache.stats()["pending_inserts"]:
                pass  # the inserter has not picked the job up yet
            while store.indexed < store.appended:
                d = cache.draft("small", [5, 6, 7, 8, 5, 6], 4)
                own = cache.draft(rid, marker, 4, one_branch=True)
                if store.indexed < store.appended:
                    observed += 1  # both drafts returned while the prompt was still being indexed
                    assert d.tokens and d.tokens[0] == 7
                    check_draft(own, 4, True)
            cache.synchronize()
            assert store.indexed == store.appended == size
            assert cache.draft(rid, marker, 4, one_branch=True).tokens == tail
            cache.finish(rid)
            if observed:
                break
        assert observed > 0, "indexing always finished before a draft could run"


def test_prompt_indexing_progresses_under_back_to_back_batch_drafts():
    """The insert thread yields to running drafts, but only for a bounded
    time per chunk: a prompt is indexed even while another thread drafts
    batches without pause (inside ``batch_draft`` a draft is always
    running)."""
    from lookahead.trie._inserter import drafts_running

    marker, tail = list(range(1, 9)), [9, 10, 11, 12]
    big = np.random.default_rng(2).integers(1000, 50000, size=1 << 15).astype(np.int32)
    big[-100:-88] = marker + tail
    with open_cache(max_memory_bytes=1 << 20) as cache:
        for i in range(4):
            cache.put_prompt(("live", i), [5, 6, 7, 8] * 4)
        cache.synchronize()
        stop, drafted = threading.Event(), []

        def draft_batches():
            rids, contexts = [("live", i) for i in range(4)], [[5, 6, 7, 8, 5, 6]] * 4
            while not stop.is_set():
                drafted.append(cache.batch_draft(rids, contexts, 4)[0].tokens)

        drafter = threading.Thread(target=draft_batches)
        drafter.start()
        try:
            while not drafted:
                pass
            cache.put_prompt("big", big)
            indexer = threading.Thread(target=cache.synchronize)
            indexer.start()
            indexer.join(timeout=300)  # a hang detector, not a timing
            assert not indexer.is_alive(), "prompt indexing starved by back-to-back drafts"
        finally:
            stop.set()
            drafter.join()
        assert drafts_running() == 0
        assert all(d and d[0] == 7 for d in drafted)
        assert cache.draft("big", marker, 4, one_branch=True).tokens == tail


def test_drafts_running_is_zero_after_every_kind_of_return():
    """The count the insert thread yields to is balanced even when a draft
    raises: otherwise every later prompt would be indexed at the slow,
    yielding pace."""
    from lookahead.trie._inserter import drafts_running

    with open_cache() as cache:
        cache.put_prompt("a", [1, 2, 3, 1, 2])
        cache.put_prompt("b", [4, 5, 6, 4, 5])
        cache.synchronize()
        assert drafts_running() == 0
        assert cache.draft("a", [1, 2], 4).tokens[:1] == [3]
        assert [d.tokens[:1] for d in cache.batch_draft(["a", "b"], [[1, 2], [4, 5]], 4)] == [[3], [6]]
        with pytest.raises(ValueError, match="context"):
            cache.batch_draft(["a", "b"], [[1, 2], [4, -5]], 4)  # fails on the second request
        with pytest.raises(ValueError, match="unknown request"):
            cache.batch_draft(["a", "zzz"], [[1, 2], [4, 5]], 4)
        with pytest.raises(ValueError):
            cache.draft("a", [1, 2**40], 4)
        assert drafts_running() == 0


def test_store_freed_while_its_insert_is_queued():
    """``finish`` right after ``put_prompt`` drops the cache's last reference
    to the store while the native inserter may still be indexing it: the
    queued job co-owns the store, so nothing is freed under it, later
    requests are served, and the output is shared once."""
    rng = np.random.default_rng(7)
    with open_cache(max_memory_bytes=1 << 20) as cache:
        for i in range(20):
            big = rng.integers(1000, 50000, size=1 << 16).astype(np.int32)
            cache.put_prompt(("gone", i), big)
            cache.put_output(("gone", i), [1, 2, 3, 4, 5])
            cache.finish(("gone", i))
            del big
        cache.put_prompt("after", [7, 8, 9, 7, 8])
        cache.synchronize()
        stats = cache.stats()
        assert stats["pending_inserts"] == 0 and stats["failed_inserts"] == 0
        assert stats["active_requests"] == 1 and stats["finished"] == 20
        assert cache.draft("after", [7, 8], 2, one_branch=True).tokens == [9, 7]
        # The finished outputs reached the shared history: one separator plus
        # the prompt-tail context plus the 5 output tokens per request.
        assert stats["shared_tokens_seen"] == 20 * (1 + cache.config.share_prompt_tail + 5)


def test_inserter_restarts_after_close():
    """``close`` applies what is queued and stops the native thread; a later
    insert starts it again, and inline mode (``background=False``) applies
    inserts before returning."""
    for background in (True, False):
        cache = LookaheadCache(max_memory_bytes=1 << 20, background=background)
        cache.put_prompt("a", [1, 2, 3, 1, 2])
        cache.close()
        assert cache._requests["a"].store.indexed == 5
        cache.put_prompt("b", [4, 5, 6, 4, 5])
        if not background:
            assert cache._requests["b"].store.indexed == 5
        cache.synchronize()
        assert cache.draft("b", [4, 5], 1).tokens == [6]
        cache.close()
