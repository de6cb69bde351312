"""Tenant isolation in the drafting API: scopes, their memory budget, and
their persistence.

* A scope drafts its own text; no other scope, nor the default scope, nor a
  request that shares nothing, is ever drafted it (a guesser who knows the
  first 40 tokens of another scope's text learns nothing of the rest).
* A history drafts the same whatever its size: growing it as its scope is
  used never changes a draft (the full ring's chains at any size), and a
  small one that wraps drafts as the reference model does.
* Many scopes: the reference model, determinism and thread safety; 2,000
  and 10,000 scopes within the budget, the least recently used scope's
  oldest text going first, and no per-scope state left after churn.
* Saved files keep every scope isolated; format 1 loads as the default
  scope; a damaged file is set aside; saving runs off the caller's thread
  and never clobbers another saver's file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

from lookahead import LookaheadCache, LookaheadConfig  # noqa: E402
from lookahead.trie._drafting import DraftConfig, Drafter  # noqa: E402
from lookahead.trie._store import TokenStore  # noqa: E402
from lookahead.trie._tuning import DraftTuning  # noqa: E402
from lookahead.trie.cache import Draft  # noqa: E402
from lookahead.trie.scopes import MIN_CAPACITY, Drop, Resize, ScopeBudget  # noqa: E402
from draft_paths import check_paths_in_history  # noqa: E402
from trie_reference import Params, RefCache, RefStore, draft as ref_draft  # noqa: E402

LEAD = 40  # tokens of another scope's text that a guesser knows
SECRET = list(range(5000, 5240))  # ids no other stream holds: any draft of them came from this text
PROMPT = list(range(100, 160))


@contextlib.contextmanager
def open_cache(**kw):
    cache = LookaheadCache(**kw)
    try:
        yield cache
    finally:
        cache.close()


def serve(cache, rid, prompt, output, scope=None, share=True, step=3) -> None:
    """One whole request, its output given a few tokens at a time."""
    cache.put_prompt(rid, prompt, scope=scope, share=share)
    for i in range(0, len(output), step):
        cache.put_output(rid, output[i:i + step])
    cache.finish(rid)


def guess(cache, rid, scope=None, share=True) -> tuple[int, int]:
    """A request that knows the secret's first LEAD tokens and learns the
    rest a token at a time, drafting after each (trees and chains).  Returns
    (drafts proposing the secret's next token, drafts proposing any token of
    the secret not yet in the request's own stream)."""
    cache.put_prompt(rid, SECRET[:LEAD], scope=scope, share=share)
    cache.synchronize()
    next_token = unseen = 0
    for i in range(LEAD, len(SECRET)):
        for one_branch in (False, True):
            d = cache.draft(rid, SECRET[:i], 8, one_branch)
            next_token += SECRET[i] in d.tokens
            unseen += bool(set(d.tokens) & set(SECRET[i:]))
        cache.put_output(rid, [SECRET[i]])
        cache.synchronize()
    cache.finish(rid)
    return next_token, unseen


def native_bytes(cache) -> int:
    """What the histories' native stores hold (checking that the drafts'
    view of them is the budget's)."""
    cache.synchronize()
    assert {k: s.store for k, s in cache._scopes.items()} == cache._histories
    return sum(s.store.nbytes for s in cache._scopes.values())


# ---------------------------------------------------------------------------
# Isolation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("victim", ["alice", None])
def test_no_other_scope_is_drafted_a_scopes_text(victim):
    steps = 2 * (len(SECRET) - LEAD)
    with open_cache() as cache:
        serve(cache, "victim", PROMPT, SECRET, scope=victim)
        # The same scope drafts it: nearly every step proposes the next token.
        hits, _ = guess(cache, "friend", scope=victim)
        assert hits >= 0.95 * steps, hits
        # Another named scope, the default scope (or a named one when the
        # victim is the default), and a request sharing nothing: never.
        for i, (scope, share) in enumerate([("mallory", True), ("alice" if victim is None else None, True),
                                            (victim, False)]):
            assert guess(cache, f"guesser-{i}", scope=scope, share=share) == (0, 0), (scope, share)
        # The guessers' own histories hold what they saw, and only that.
        stats = cache.scope_stats()
        assert set(stats) == {victim, "mallory", "alice" if victim is None else None}


def test_scopes_are_strings_or_none():
    with open_cache() as cache:
        for bad in (5, b"tenant", ("a",), 1.5, object(), True):
            with pytest.raises(TypeError, match="scope must be a str or None"):
                cache.put_prompt("r", [1, 2, 3], scope=bad)
        with pytest.raises(TypeError, match="share must be a bool"):
            cache.put_prompt("r", [1, 2, 3], share="yes")
        assert len(cache) == 0 and cache.stats()["prompts"] == 0  # nothing was taken

        class Tenant(str):
            pass

        serve(cache, "r", [1, 2, 3], [4, 5, 6], scope=Tenant("t"))
        assert list(cache.scope_stats()) == ["t"] and type(list(cache.scope_stats())[0]) is str


def test_a_request_that_shares_nothing_leaves_no_history():
    with open_cache() as cache:
        serve(cache, "solo", PROMPT, SECRET, share=False)
        cache.synchronize()
        assert cache.stats()["scopes"] == 0 and cache.stats()["shared_bytes"] == 0
        assert guess(cache, "next") == (0, 0)
        # ... while it drafts from its own prompt and output as any request.
        cache.put_prompt("copy", PROMPT + PROMPT[:5], share=False)
        cache.synchronize()
        assert cache.draft("copy", PROMPT + PROMPT[:5], 4).tokens == PROMPT[5:9]
        cache.finish("copy")


# ---------------------------------------------------------------------------
# A history drafts the same whatever its size
# ---------------------------------------------------------------------------


MAX_ID = 2**31 - 1


def _draft_config(config: LookaheadConfig) -> DraftConfig:
    # The native knobs a cache of ``config`` drafts with.
    cache = LookaheadCache(config)
    cache.close()
    return cache._draft_config


def _shares(rng, vocab: int, count: int) -> list[list[int]]:
    # Output shares as a cache appends them: a separator, a little context, output.
    return [[-1] + [rng.randrange(vocab) for _ in range(rng.randint(5, 150))] for _ in range(count)]


@pytest.mark.parametrize("vocab", [6, 300])
def test_a_growing_history_drafts_as_the_full_ring(vocab):
    """The same shares into today's full-size ring and into a scope's
    history that starts empty and doubles as needed (a map of heads while
    small, the full table from 1/8 of the full size): every draft equal,
    with the many collisions of a tiny vocabulary too."""
    rng = random.Random(vocab)
    orders, full = (1, 2, 4, 8), 1 << 14
    key_bits = full.bit_length() - 2
    ring, history = TokenStore(full, True, orders), TokenStore(0, True, orders, key_bits)
    assert ring.nbytes == 28 * full
    params = _draft_config(LookaheadConfig())
    drafter, fed, compared, modes = Drafter(Draft), [], 0, set()
    for share in _shares(rng, vocab, 260):
        cap = max(MIN_CAPACITY, history.capacity)
        while cap < len(fed) + len(share):
            cap *= 2
        if cap > history.capacity:
            history.resize(min(cap, full))
        for store in (ring, history):
            store.append_indexed(np.asarray(share, np.int32))
        fed += share
        modes.add(history.sparse)
        for _ in range(5):
            end = rng.randint(2, len(fed))
            ctx = [t for t in fed[max(0, end - 40): end] if t >= 0] or [0]
            for one_branch in (False, True):
                a = drafter.draft_context(None, ring, ctx, 8, one_branch, params, MAX_ID)
                b = drafter.draft_context(None, history, ctx, 8, one_branch, params, MAX_ID)
                assert a == b, (len(fed), ctx)
                compared += bool(a.tokens)
    assert modes == {True, False}  # both layouts of the heads were compared
    assert len(fed) > full and history.capacity == full  # and a full history that wraps
    assert compared > 2000


def test_a_small_history_that_wraps_drafts_as_the_reference():
    """A history kept small (its growth refused, as when the process is out
    of memory) wraps like a ring: its map of heads fills with evicted keys,
    reuses and purges them, and every draft equals the reference's."""
    rng = random.Random(3)
    config = LookaheadConfig(orders=(1, 2, 4))
    key_bits = 14
    store, ref = TokenStore(0, True, config.orders, key_bits), RefStore(0, True, config.orders, key_bits)
    store.resize(256)
    ref.resize(256)
    assert store.sparse
    prm, native = Params.from_config(config), _draft_config(config)
    drafter, compared = Drafter(Draft), 0
    for share in _shares(rng, 400, 120):  # ~9k tokens through 256
        store.append_indexed(np.asarray(share, np.int32))
        ref.append(share)
        live = [t for t in ref.toks[ref.base:] if t >= 0]
        for _ in range(4):
            end = rng.randint(1, len(live))
            ctx = live[max(0, end - 12): end]
            for one_branch in (False, True):
                got = drafter.draft_context(None, store, ctx, 6, one_branch, native, MAX_ID)
                assert (got.tokens, got.parents) == ref_draft(None, ref, ctx, 6, one_branch, prm)[:2]
                compared += bool(got.tokens)
    assert store.appended > 30 * 256 and store.size == 256 and compared > 300


# ---------------------------------------------------------------------------
# Many scopes
# ---------------------------------------------------------------------------


def _tenant_requests(rng, n: int, vocab: int, tenants: int) -> list:
    # (scope, share, prompt, response): each tenant repeats its own phrases.
    phrases = {t: [[rng.randrange(vocab) for _ in range(8)] for _ in range(6)] for t in range(tenants)}
    out = []
    for _ in range(n):
        t = rng.randrange(tenants)
        body = [tok for _ in range(rng.randint(4, 40)) for tok in rng.choice(phrases[t])[: rng.randint(2, 8)]]
        scope = None if t == 0 else f"tenant-{t}"
        out.append((scope, rng.random() > 0.1, body[:30], body[30:] or [1]))
    return out


def test_many_scopes_match_the_reference_under_eviction():
    """Requests of twelve scopes, two live at a time, through a budget that
    holds a few of them: histories grow, shrink (their oldest text going)
    and are dropped, and every draft still equals the reference's."""
    rng = random.Random(11)
    cfg = LookaheadConfig(max_memory_bytes=1 << 18, flush_tokens=16)
    ref, requests = RefCache(cfg), _tenant_requests(rng, 160, 400, 12)
    seen_scopes, caps, compared = set(), {}, 0
    with open_cache(max_memory_bytes=1 << 18, flush_tokens=16) as cache:
        live = {}
        for rid, (scope, share, prompt, response) in enumerate(requests):
            cache.put_prompt(rid, prompt, scope=scope, share=share)
            ref.put_prompt(rid, prompt, scope, share)
            live[rid] = [prompt + response, len(prompt)]
            seen_scopes.add(scope)
            while len(live) > (2 if rid < len(requests) - 1 else 0):
                r = rng.choice(list(live))
                stream, pos = live[r]
                if pos >= len(stream):
                    cache.finish(r)
                    ref.finish(r)
                    del live[r]
                    continue
                cache.synchronize()
                budget, one_branch = rng.randint(1, 10), rng.random() < 0.3
                d = cache.draft(r, stream[:pos], budget, one_branch)
                assert (d.tokens, d.parents) == ref.draft(r, stream[:pos], budget, one_branch)[:2]
                compared += bool(d.tokens)
                step = rng.randint(1, 4)
                cache.put_output(r, stream[pos: pos + step])
                ref.put_output(r, stream[pos: pos + step])
                live[r][1] += step
                for key, s in cache.scope_stats().items():
                    caps.setdefault(key, []).append(s["capacity"])
        stats, kept = cache.stats(), cache.scope_stats()
        assert stats["scope_bytes"] <= cfg.max_memory_bytes and native_bytes(cache) == stats["scope_bytes"]
        assert set(kept) == set(ref.budget.scopes)
    assert compared > 1000
    assert len(kept) < len(seen_scopes)  # some were dropped ...
    assert any(any(b < a for a, b in zip(c, c[1:])) for c in caps.values())  # ... and some shrank


def _scripted_calls(seed: int, n: int = 60) -> list:
    rng = random.Random(seed)
    calls, live = [], {}
    for rid, (scope, share, prompt, response) in enumerate(_tenant_requests(rng, n, 50, 9)):
        calls.append(("put_prompt", (rid, prompt), {"scope": scope, "share": share}))
        live[rid] = list(prompt)
        for tok in response:
            r = rng.choice(list(live))
            calls.append(("put_output", (r, [tok]), {}))
            live[r].append(tok)
            if rng.random() < 0.3:
                calls.append(("synchronize", (), {}))
                calls.append(("draft", (r, list(live[r]), rng.randint(1, 12), rng.random() < 0.3), {}))
        if len(live) > 3:
            r = rng.choice(list(live))
            calls.append(("finish", (r,), {}))
            del live[r]
    return calls


def test_deterministic_with_many_scopes():
    calls = _scripted_calls(seed=5)
    results = []
    for background in (True, True, False):
        with open_cache(max_memory_bytes=1 << 17, flush_tokens=8, background=background) as cache:
            drafts = [getattr(cache, name)(*args, **kw) for name, args, kw in calls]
            results.append(([tuple(d) for d, (name, _, _) in zip(drafts, calls) if name == "draft"],
                            cache.scope_stats()))
    assert results[0] == results[1] == results[2]
    drafts, scopes = results[0]
    assert sum(bool(d[0]) for d in drafts) > len(drafts) // 2
    used = {kw["scope"] for name, _, kw in calls if name == "put_prompt" and kw["share"]}
    assert 1 < len(scopes) < len(used)  # several histories, and some dropped for the budget


def test_thread_safety_with_many_scopes():
    """Four threads serve requests of their own scopes and of two scopes
    they all share, while a racer drafts live requests: no errors, the
    budget holds, and afterwards each scope drafts from its own text only."""
    cache = LookaheadCache(max_memory_bytes=1 << 19, flush_tokens=8)
    streams: dict = {}  # scope -> every stream fed in it
    live: dict = {}
    lock, errors, done = threading.Lock(), [], threading.Event()

    names = [f"own-{w}-{k}" for w in range(4) for k in range(5)] + ["common-a", "common-b", None]

    def worker(w: int) -> None:
        rng = random.Random(w)
        try:
            for i in range(40):
                scope = rng.choice([f"own-{w}-{i % 5}", "common-a", "common-b", None])
                offset = 1000 * names.index(scope)  # each scope's own ids
                prompt = [offset + rng.randrange(30) for _ in range(rng.randint(1, 60))]
                rid = f"w{w}-{i}"
                cache.put_prompt(rid, prompt, scope=scope)
                stream = list(prompt)
                with lock:
                    streams.setdefault(scope, []).append(stream)
                    live[rid] = stream
                for _ in range(rng.randint(5, 40)):
                    out = [offset + rng.randrange(30) for _ in range(rng.randint(1, 3))]
                    cache.put_output(rid, out)
                    with lock:
                        stream.extend(out)
                        ctx = list(stream)
                    cache.draft(rid, ctx, rng.randint(1, 8), rng.random() < 0.3)
                with lock:
                    del live[rid]
                cache.finish(rid)
        except Exception as exc:
            errors.append(exc)

    def racer() -> None:
        rng = random.Random(99)
        try:
            while not done.is_set():
                with lock:
                    if not live:
                        continue
                    rids = rng.sample(sorted(live), min(3, len(live)))
                    ctxs = [list(live[r]) for r in rids]
                try:
                    cache.batch_draft(rids, ctxs, 6)
                except ValueError as exc:
                    assert "unknown request" in str(exc)
                cache.stats()
                cache.scope_stats()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)] + [threading.Thread(target=racer)]
    for t in threads:
        t.start()
    for t in threads[:-1]:
        t.join(timeout=300)
    done.set()
    threads[-1].join(timeout=60)
    try:
        assert not any(t.is_alive() for t in threads) and not errors, errors
        stats = cache.stats()
        assert stats["failed_inserts"] == 0 and stats["active_requests"] == 0
        assert stats["scope_bytes"] <= cache.config.max_memory_bytes == 1 << 19
        assert native_bytes(cache) == stats["scope_bytes"]
        rng = random.Random(1)
        for scope in ("common-a", "common-b", None, "own-0-1"):
            for k in range(10):
                stream = rng.choice(streams[scope])
                ctx = stream[: rng.randint(1, len(stream))]
                cache.put_prompt(("after", k), ctx[-1:], scope=scope)
                cache.synchronize()
                d = cache.draft(("after", k), ctx, 8)
                check_paths_in_history(d, ctx, streams[scope] + [ctx])
                cache.finish(("after", k))
    finally:
        cache.close()


def test_2000_scopes_stay_within_the_budget():
    """2,000 scopes of three requests each through a 4 MiB budget: it holds,
    the bytes the histories hold are what the budget counts, and what stays
    is the most recently used scopes' text, which still drafts."""
    budget = 4 << 20
    rng = random.Random(0)
    with open_cache(max_memory_bytes=budget, flush_tokens=32) as cache:
        for s in range(2000):
            scope = f"tenant-{s}"
            for r in range(3):
                serve(cache, (s, r), [rng.randrange(1000) for _ in range(20)], [7000 + s, 9, 7000 + s, 9, s, r],
                      scope=scope)
            if s % 500 == 499:
                stats = cache.stats()
                assert stats["scope_bytes"] <= budget and native_bytes(cache) == stats["scope_bytes"]
        kept = list(cache.scope_stats())
        assert 50 < len(kept) < 2000 and cache.stats()["scopes"] == len(kept)
        assert kept == [f"tenant-{s}" for s in range(2000 - len(kept), 2000)]  # the most recent, in order
        cache.put_prompt("probe", [9, 7000 + 1999], scope="tenant-1999")
        cache.synchronize()
        assert cache.draft("probe", [9, 7000 + 1999], 2, one_branch=True).tokens == [9, 1999]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_10000_scopes_cost_what_their_text_costs():
    """10,000 scopes of a request each in the default budget: all kept, in
    the smallest history each (21 kB), not 10,000 rings (224 MB each)."""
    gc.collect()
    before = _rss()
    with open_cache() as cache:
        for s in range(10_000):
            serve(cache, s, [s % 1000, 1, 2], list(range(100)), scope=str(s), step=50)
        stats = cache.stats()
        assert stats["scopes"] == 10_000
        assert stats["scope_bytes"] == 10_000 * cache._budget.bytes_for(MIN_CAPACITY) == native_bytes(cache)
        assert stats["scope_bytes"] <= cache.config.max_memory_bytes
        assert _rss() - before < 2 * stats["scope_bytes"]


def test_scope_churn_leaves_no_state_behind():
    """50,000 scopes come and go through a 1 MiB budget: the scopes kept,
    the bookkeeping and the process's memory stay flat."""
    with open_cache(max_memory_bytes=1 << 20, flush_tokens=16) as cache:
        marks = {}
        for s in range(50_000):
            serve(cache, s, [1, 2, 3, s % 500], [s % 700, 4, 5, 6], scope=f"s{s}")
            if s + 1 in (5_000, 50_000):
                cache.synchronize()
                gc.collect()
                marks[s + 1] = (len(cache._scopes), cache.stats()["scope_bytes"], _rss())
        assert marks[5_000][:2] == marks[50_000][:2]
        assert marks[50_000][0] <= (1 << 20) // cache._budget.bytes_for(MIN_CAPACITY)
        assert marks[50_000][2] - marks[5_000][2] < 8 << 20


def test_the_least_recently_used_scopes_oldest_text_goes_first():
    full = 1 << 13  # 2**12 chain keys; histories below 1024 tokens keep their heads in a map
    budget = ScopeBudget(max_bytes=28 * full, full_capacity=full, norders=4)
    assert [budget.bytes_for(c) for c in (256, 512, 4096)] == [256 * 84, 512 * 84, 4096 * 20 + 16 * 4096]
    scopes = {}
    for key in ("a", "b", "c"):
        scopes[key], steps = budget.share(key, 500)
        assert steps == [Resize(scopes[key], 512)]
    budget.touch("a")  # used again: "b" is now the least recently used
    d, steps = budget.share("d", 3000)
    # 4096 tokens for "d" need 47 kB more than the budget has: "b" gives up
    # all of its text (halving it would free 21.5 kB), "c" its oldest half;
    # "a", used most recently, keeps all of its own.
    assert steps == [Drop(scopes["b"]), Resize(scopes["c"], 256), Resize(d, 4096)]
    assert list(budget.scopes) == ["c", "a", "d"] and budget.bytes <= 28 * full
    assert (scopes["a"].held, scopes["c"].held, scopes["c"].base, d.held) == (500, 256, 500 - 256, 3000)
    assert budget.tokens == 500 + 256 + 3000 and budget.appended == 4500


# ---------------------------------------------------------------------------
# Persistence
# ---------------------------------------------------------------------------


def _scoped_cache_with_secrets(cache) -> dict:
    secrets_by_scope = {}
    for k, scope in enumerate(["alice", None, "bob"]):
        secret = list(range(20_000 + 1000 * k, 20_000 + 1000 * k + 120))
        serve(cache, f"r{k}", PROMPT, secret, scope=scope)
        secrets_by_scope[scope] = secret
    cache.synchronize()
    return secrets_by_scope


def _who_drafts(cache, secrets_by_scope) -> dict:
    """For each (prober's scope, secret's scope): whether a probe knowing
    the secret's first 40 tokens is drafted its 41st."""
    out = {}
    for p, prober in enumerate(secrets_by_scope):
        for owner, secret in secrets_by_scope.items():
            rid = ("probe", p, owner)
            cache.put_prompt(rid, secret[:LEAD], scope=prober)
            cache.synchronize()
            out[(prober, owner)] = secret[LEAD] in cache.draft(rid, secret[:LEAD], 4).tokens
            cache.finish(rid)
    return out


def test_saved_scopes_load_isolated(tmp_path):
    path = tmp_path / "trie.npz"
    with open_cache() as cache:
        secrets_by_scope = _scoped_cache_with_secrets(cache)
        cache.save(path)
        order = list(cache.scope_stats())
    loaded = LookaheadCache.load(path)
    try:
        assert list(loaded.scope_stats()) == order  # least recently used first, as saved
        assert _who_drafts(loaded, secrets_by_scope) == {(a, b): a == b for a in order for b in order}
    finally:
        loaded.close()


def test_a_format_1_file_loads_as_the_default_scope(tmp_path):
    """The format this release replaces: one shared history."""
    secret = list(range(30_000, 30_100))
    shared = np.asarray([-1] + PROMPT[-24:] + secret, np.int32)
    # A file of that release keeps the tuning among the options.
    config = {**dataclasses.asdict(LookaheadConfig()), **dataclasses.asdict(DraftTuning())}
    config["orders"] = list(config["orders"])
    meta = np.frombuffer(json.dumps({"format": 1, "config": config}).encode(), np.uint8)
    path = tmp_path / "v1.npz"
    np.savez_compressed(path, shared=shared, meta=meta)
    cache = LookaheadCache.load(path)
    try:
        assert list(cache.scope_stats()) == [None] and cache.stats()["shared_tokens"] == len(shared)
        for scope, expected in ((None, True), ("tenant", False)):
            cache.put_prompt(scope or "default", secret[:LEAD], scope=scope)
            cache.synchronize()
            assert (secret[LEAD] in cache.draft(scope or "default", secret[:LEAD], 4).tokens) is expected
    finally:
        cache.close()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "lengths"])
def test_open_sets_a_damaged_file_aside_and_starts_empty(tmp_path, caplog, damage):
    path = tmp_path / "trie.npz"
    with open_cache() as cache:
        _scoped_cache_with_secrets(cache)
        cache.save(path)
    good = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00not a trie\n" * 100)
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a well-formed archive whose scopes do not add up
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        arrays["lengths"] = arrays["lengths"] + 1
        np.savez(str(path), **arrays)
    damaged = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="lookahead.trie.cache"):
        cache = LookaheadCache.open(path)
    try:
        assert cache.stats()["scopes"] == 0 and len(cache) == 0
        assert not path.exists() and Path(f"{path}.corrupt").read_bytes() == damaged
        assert f"moved it to {path}.corrupt" in caplog.text and "starting with an empty history" in caplog.text
        # It serves, and saves a good file again.
        serve(cache, "r", PROMPT, SECRET)
        cache.save(path)
    finally:
        cache.close()
    reopened = LookaheadCache.open(path)
    assert reopened.stats()["shared_tokens"] > len(SECRET)
    reopened.close()


def test_open_without_a_file_is_an_empty_cache(tmp_path):
    for path in (None, tmp_path / "missing.npz"):
        cache = LookaheadCache.open(path, max_memory_bytes=1 << 20)
        assert cache.config.max_memory_bytes == 1 << 20 and cache.stats()["scopes"] == 0
        cache.close()
    assert not list(tmp_path.iterdir())


def test_background_save_does_not_hold_up_the_caller(tmp_path):
    """While a background save is writing (held here until released), the
    caller goes on feeding and drafting; saves asked for meanwhile become
    one more, of the newest state."""
    path = tmp_path / "trie.npz"
    with open_cache() as cache:
        serve(cache, "a", PROMPT, SECRET, scope="t")
        writing, release, writes = threading.Event(), threading.Event(), []
        real_write = cache._write

        def held_write(p):
            writes.append(cache.stats()["shared_tokens_seen"])
            writing.set()
            assert release.wait(60)
            real_write(p)

        cache._write = held_write
        first = cache.save(path, background=True)
        assert writing.wait(60) and not first.done()
        # The caller is not held up: it serves another request meanwhile.
        serve(cache, "b", PROMPT, SECRET[:100], scope="t")
        cache.put_prompt("c", SECRET[:LEAD], scope="t")
        cache.synchronize()
        assert SECRET[LEAD] in cache.draft("c", SECRET[:LEAD], 4).tokens
        cache.finish("c")
        assert not first.done()
        more = [cache.save(path, background=True) for _ in range(5)]
        assert len({id(f) for f in more}) == 1 and not more[0].done()
        release.set()
        assert first.result(60) >= 0 and more[0].result(60) >= 0
        assert len(writes) == 2 and writes[1] > writes[0]  # the second saved the newer history
    loaded = LookaheadCache.load(path)
    assert loaded.stats()["shared_tokens_seen"] == writes[1]
    loaded.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trie.npz"]  # no temporary file left


def test_replicas_saving_to_one_path_never_clobber_each_other(tmp_path):
    """Three processes (data-parallel replicas sharing a path) save to it
    40 times each, at once: every save succeeds, the file is always a whole
    one, and no temporary file is left."""
    path = tmp_path / "trie.npz"
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from lookahead import LookaheadCache
        cache = LookaheadCache(max_memory_bytes=1 << 20)
        rank = int(sys.argv[3])
        for i in range(40):
            cache.put_prompt(i, [rank, i])
            cache.put_output(i, list(range(rank * 1000, rank * 1000 + 300)))
            cache.finish(i)
            cache.save(sys.argv[2], background=i % 2 == 0)
        cache.close()
        print("ok")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(REPO), str(path), str(rank)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(3)]
    loads = 0
    while any(p.poll() is None for p in procs):
        if path.exists():
            try:
                LookaheadCache.load(path).close()
                loads += 1
            except FileNotFoundError:
                pass
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err
    loaded = LookaheadCache.load(path)
    assert loaded.stats()["shared_tokens"] > 40 * 300
    loaded.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trie.npz"]
    assert loads > 0


# ---------------------------------------------------------------------------
# Replay: what isolation costs on a trace
# ---------------------------------------------------------------------------


def test_replay_measures_isolation_by_a_trace_field(tmp_path):
    """Each request answers by quoting the previous request's answer, and
    the requests alternate between two tenants: drafting it from the
    previous answer needs the other tenant's history.  ``--scope-by tenant``
    costs what ``--tenants 2`` does (the same split), ``--no-sharing`` more,
    ``--tenants 1`` nothing; a line without the field is in the default scope."""
    rng = random.Random(4)
    lines, answer = [], [rng.randrange(3000) for _ in range(60)]
    for i in range(24):
        line = {"prompt": [rng.randrange(3000) for _ in range(20)], "response": answer}
        if i != 23:
            line["tenant"] = f"tenant-{i % 2}"  # the last one has none: the default scope
        lines.append(line)
        answer = answer[10:] + [rng.randrange(3000) for _ in range(10)]
    trace = tmp_path / "tenants.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    from lookahead.replay import load_scopes, main

    assert load_scopes(str(trace), "tenant") == [f"tenant-{i % 2}" for i in range(23)] + [None]
    out = tmp_path / "out"
    assert main(["--trace", str(trace), "--budget", "8", "--drafters", "lookahead", "--scope-by", "tenant",
                 "--tenants", "1", "2", "--no-sharing", "--no-plot", "--quiet", "--out-dir", str(out)]) == 0
    al = {r["split"]: r["acceptance_length"] for r in json.loads((out / "replay.json").read_text())}
    assert set(al) == {"1 tenant", "2 tenants", "by tenant", "no sharing"}
    assert al["no sharing"] < al["by tenant"] < al["1 tenant"]
    # One tenant is one shared history: exactly the unscoped replay.
    assert main(["--trace", str(trace), "--budget", "8", "--drafters", "lookahead", "--no-plot", "--quiet",
                 "--out-dir", str(out)]) == 0
    (shared,) = json.loads((out / "replay.json").read_text())
    assert shared["split"] == "" and shared["acceptance_length"] == al["1 tenant"]
    # The last request (no tenant) alone differs from the round-robin split.
    assert abs(al["by tenant"] - al["2 tenants"]) < 0.05 * al["2 tenants"]


def test_clear_history_forgets_every_scope_and_answer():
    from lookahead import LookaheadCache

    cache = LookaheadCache(background=False)
    text = list(range(100, 300))
    for scope in (None, "cache_salt:a"):
        cache.put_prompt(f"r{scope}", [1, 2, 3], scope=scope)
        cache.put_output(f"r{scope}", text)
        cache.finish(f"r{scope}")
    cache.put_prompt("live", [7, 8, 9])
    cache.put_output("live", [5, 6])
    stats = cache.stats()
    assert stats["shared_tokens"] >= 400 and stats["answers_remembered"] == 2
    cache.put_prompt("before", text[:50])
    assert text[50] in cache.draft("before", text[:50], 4).tokens  # drafted from the history
    cache.finish("before")
    dropped = cache.clear_history()
    stats = cache.stats()
    assert dropped >= 400 and stats["shared_tokens"] == 0 and stats["scopes"] == 0
    assert stats["answers_remembered"] == 0
    cache.put_prompt("after", text[:50])
    assert text[50] not in cache.draft("after", text[:50], 4).tokens
    # The live request still drafts from its own text, and new text is shared again.
    cache.finish("live")
    assert cache.stats()["shared_tokens"] > 0


def test_a_group_drafts_from_its_samples_as_they_are_written():
    # Eight samples of one prompt in flight (an RL group, or n > 1): a
    # sample drafts what another wrote before either has finished or reached
    # the history's flush size; another scope's sample of the same prompt does not.
    from lookahead import LookaheadCache

    cache = LookaheadCache(background=False, flush_tokens=10_000)
    prompt = list(range(10, 40))
    answer = list(range(500, 560))
    cache.put_prompt("a", prompt)
    cache.put_prompt("b", prompt)
    cache.put_prompt("other-tenant", prompt, scope="cache_salt:t2")
    cache.put_prompt("other-prompt", prompt[:-1] + [99])
    cache.put_output("a", answer)
    assert cache.stats()["shared_tokens"] == 0  # nothing shared yet
    cache.synchronize()
    assert cache.draft("b", prompt, 4).tokens[:1] == [answer[0]]
    assert cache.batch_draft(["b"], [prompt + answer[:20]], 4)[0].tokens[:1] == [answer[20]]
    assert answer[0] not in cache.draft("other-tenant", prompt, 4).tokens
    assert answer[21] not in cache.draft("other-prompt", prompt[:-1] + [99] + answer[:20], 4).tokens
    cache.finish("a")
    cache.finish("b")
    assert sorted(map(tuple, cache._groups.values())) == [("other-prompt",), ("other-tenant",)]
