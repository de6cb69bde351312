"""The same calls give the same drafts, and many threads at once break nothing.

Determinism across runs and between background and inline inserts; a
stress of several threads feeding, drafting and finishing requests while
others draft whatever is live; a draft racing the end of its own request;
exact counters under concurrent outputs.
"""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

from lookahead import LookaheadCache  # noqa: E402
from draft_paths import check_paths_in_history  # noqa: E402
from trie_helpers import SMALL_MEMORY, check_draft, open_cache  # noqa: E402


def _scripted_calls(seed: int, n_requests: int = 30, vocab: int = 12):
    """A fixed sequence of (method, args) calls, with drafts after synchronize()."""
    rng = random.Random(seed)
    calls, live = [], {}
    for rid in range(n_requests):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 200))]
        calls.append(("put_prompt", (rid, prompt)))
        live[rid] = list(prompt)
        for _ in range(rng.randint(1, 40)):
            r = rng.choice(list(live))
            out = [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
            calls.append(("put_output", (r, out)))
            live[r] += out
            if rng.random() < 0.5:
                calls.append(("synchronize", ()))
                calls.append(("draft", (r, list(live[r]), rng.randint(1, 16), rng.random() < 0.3)))
        if rng.random() < 0.6:
            r = rng.choice(list(live))
            calls.append(("finish", (r,)))
            del live[r]
    return calls


def _run_calls(cache, calls) -> list:
    drafts = []
    for name, args in calls:
        result = getattr(cache, name)(*args)
        if name == "draft":
            drafts.append((result.tokens, result.parents))
    return drafts


def test_deterministic_drafts():
    calls = _scripted_calls(seed=2024)
    with open_cache(max_memory_bytes=1 << 16, flush_tokens=8) as a, \
            open_cache(max_memory_bytes=1 << 16, flush_tokens=8) as b, \
            open_cache(max_memory_bytes=1 << 16, flush_tokens=8, background=False) as inline:
        first, second, third = _run_calls(a, calls), _run_calls(b, calls), _run_calls(inline, calls)
        assert first == second == third
        assert sum(bool(t) for t, _ in first) > len(first) // 2
        assert a.stats()["shared_tokens_seen"] > a.stats()["shared_capacity"]  # eviction happened too


def test_thread_safety_stress():
    """Several threads put, draft and finish many requests at once while a
    racer drafts whatever requests are live (including ones being finished):
    every draft is valid or a ValueError for a finished request, nothing
    fails, and the counters add up afterwards."""
    cache = LookaheadCache(max_memory_bytes=1 << 18, flush_tokens=16)
    n_workers, per_worker, vocab = 4, 40, 20
    live: dict = {}  # rid -> stream, shared with the racer
    history: list = []
    live_lock = threading.Lock()
    errors: list = []
    fed = {"prompts": 0, "prompt_tokens": 0, "output_tokens": 0}
    done = threading.Event()

    def worker(w: int) -> None:
        rng = random.Random(w)
        mine: dict = {}
        try:
            for i in range(per_worker):
                rid = f"w{w}-{i}"
                prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 300))]
                cache.put_prompt(rid, prompt)
                stream = list(prompt)
                with live_lock:
                    live[rid] = stream
                    history.append(stream)
                    fed["prompts"] += 1
                    fed["prompt_tokens"] += len(prompt)
                mine[rid] = stream
                for _ in range(rng.randint(1, 25)):
                    r = rng.choice(list(mine))
                    out = [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
                    cache.put_output(r, np.asarray(out, np.int64))
                    with live_lock:
                        mine[r].extend(out)
                        fed["output_tokens"] += len(out)
                        ctx = list(mine[r])
                    budget = rng.randint(0, 10)
                    d = cache.draft(r, ctx, budget, one_branch=rng.random() < 0.3)
                    check_draft(d, budget, False)
                if len(mine) > 3 or i == per_worker - 1:
                    for r in list(mine)[: len(mine) - (0 if i == per_worker - 1 else 2)]:
                        with live_lock:
                            del live[r]
                        cache.finish(r)
                        del mine[r]
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    def racer() -> None:
        rng = random.Random(99)
        races = 0
        try:
            while not done.is_set():
                with live_lock:
                    if not live:
                        continue
                    rid = rng.choice(list(live))
                    ctx = list(live[rid])
                budget = rng.randint(1, 8)
                try:
                    d = cache.draft(rid, ctx, budget)
                    check_draft(d, budget, False)
                except ValueError as exc:
                    assert "unknown request" in str(exc)
                    races += 1
                cache.stats()
        except Exception as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(n_workers)]
    racers = [threading.Thread(target=racer, daemon=True) for _ in range(2)]
    for t in workers + racers:
        t.start()
    for t in workers:
        t.join(timeout=300)
    done.set()
    for t in racers:
        t.join(timeout=60)
    try:
        assert not any(t.is_alive() for t in workers + racers), "a thread hung"
        assert not errors, errors
        cache.synchronize()
        stats = cache.stats()
        assert stats["failed_inserts"] == 0 and stats["pending_inserts"] == 0
        assert stats["active_requests"] == 0 and stats["local_bytes"] == 0
        assert stats["prompts"] == fed["prompts"] == n_workers * per_worker
        assert stats["finished"] == fed["prompts"]
        assert stats["prompt_tokens"] == fed["prompt_tokens"]
        assert stats["shared_bytes"] <= cache.config.max_memory_bytes
        # Drafts from the history built concurrently are still valid.
        rng = random.Random(5)
        for rid in range(20):
            stream = rng.choice(history)
            ctx = stream[: rng.randint(1, len(stream))] if stream else [1]
            cache.put_prompt(("after", rid), ctx)
            cache.synchronize()
            for one_branch in (False, True):
                d = cache.draft(("after", rid), ctx, 8, one_branch)
                check_draft(d, 8, one_branch)
                check_paths_in_history(d, ctx, history)
            cache.finish(("after", rid))
    finally:
        cache.close()


def test_draft_racing_finish_of_the_same_request():
    """A draft racing ``finish`` of its own request returns a valid draft or
    raises ValueError, never anything else."""
    outcomes = {"draft": 0, "error": 0}
    with open_cache(max_memory_bytes=SMALL_MEMORY) as cache:
        prompt = [i % 7 for i in range(200)]
        for i in range(150):
            cache.put_prompt(i, prompt)
            cache.synchronize()
            drafting = threading.Event()
            failures = []

            def drafter():
                for _ in range(1_000_000):  # until the request is gone
                    try:
                        d = cache.draft(i, prompt, 6)
                        check_draft(d, 6, False)
                        outcomes["draft"] += 1
                        drafting.set()
                    except ValueError as exc:
                        assert "unknown request" in str(exc)
                        outcomes["error"] += 1
                        return
                    except Exception as exc:  # anything else is a bug
                        failures.append(exc)
                        return
                    finally:
                        drafting.set()

            t = threading.Thread(target=drafter)
            t.start()
            drafting.wait()
            cache.finish(i)
            t.join(timeout=60)
            assert not t.is_alive() and not failures, failures
        cache.synchronize()
        assert cache.stats()["active_requests"] == 0
    assert outcomes["draft"] >= 150 and outcomes["error"] == 150


def test_output_token_counter_exact_under_concurrency():
    with open_cache(max_memory_bytes=SMALL_MEMORY) as cache:
        for t in range(4):
            cache.put_prompt(t, list(range(64)))
        cache.synchronize()

        def feed(t):
            for i in range(3000):
                cache.put_output(t, [i % 50, 7])

        threads = [threading.Thread(target=feed, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert cache.stats()["local_tokens"] == 4 * (64 + 6000)
        assert cache.stats()["output_tokens"] == 4 * 6000
