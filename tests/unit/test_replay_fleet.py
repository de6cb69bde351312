"""A fleet in the model-free replay (``--replicas``, ``--share``), and the
cache's insert path for another replica's text (``LookaheadCache.put_finished``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from lookahead.replay import replay
from lookahead.replay.fleet import FleetDrafter
from lookahead.trie.cache import LookaheadCache

REPO = Path(__file__).resolve().parents[2]


def _pairs(n: int, seed: int = 0, repeat: int = 1):
    """Requests whose answers recur: three in a row get the same answer (a
    retried task), so a history that has seen one helps the next, and a
    round robin deals them to different replicas."""
    rng = np.random.default_rng(seed)
    answers = [rng.integers(0, 900, size=60).astype(np.int32) for _ in range(max(1, n // 3))]
    pairs = []
    for i in range(n):
        k = (i // 3) % len(answers)
        prompt = np.concatenate([rng.integers(0, 900, size=20), [950 + k]]).astype(np.int32)
        pairs += [(prompt, answers[k])] * repeat
    return pairs


def _drafts(cache: LookaheadCache, rid, prompt, response, scope=None) -> list:
    """Every draft of a request served on ``cache`` with its recorded response."""
    cache.put_prompt(rid, prompt, scope=scope)
    cache.synchronize()
    out, context = [], list(prompt)
    for tok in response:
        draft = cache.draft(rid, np.asarray(context, np.int32), 8)
        out.append((list(draft.tokens), list(draft.parents)))
        cache.put_output(rid, [int(tok)])
        context.append(int(tok))
    cache.finish(rid)
    cache.synchronize()
    return out


def test_put_finished_drafts_as_if_served_here():
    """Another replica's request, inserted with put_finished, gives the next
    request the same drafts as if this replica had served it."""
    pairs = _pairs(6, seed=3)
    served, given = LookaheadCache(), LookaheadCache()
    try:
        for i, (prompt, response) in enumerate(pairs[:5]):
            _drafts(served, f"r{i}", prompt, response)
            given.put_finished(prompt, response)
        given.synchronize()
        prompt, response = pairs[3]  # a prompt seen before: its answer is remembered too
        a = _drafts(served, "next", prompt, response)
        b = _drafts(given, "next", prompt, response)
        assert a == b
        assert sum(len(t) for t, _ in a) > 0
        assert given.stats()["shared_tokens"] == served.stats()["shared_tokens"]
    finally:
        served.close()
        given.close()


def test_put_finished_keeps_its_scope():
    prompt, response = _pairs(1, seed=4)[0]
    cache = LookaheadCache()
    try:
        cache.put_finished(prompt, response, scope="cache_salt:a")
        cache.synchronize()
        same = _drafts(cache, "a", prompt, response, scope="cache_salt:a")
        other = _drafts(cache, "b", prompt, response, scope="cache_salt:b")
        default = _drafts(cache, "c", prompt, response, scope=None)
        assert sum(len(t) for t, _ in same) > len(response)  # drafted from the inserted answer
        # The other scopes draft from their own prompt alone, which never
        # holds the answer: the same drafts as on an empty cache.
        fresh = LookaheadCache()
        try:
            alone = _drafts(fresh, "b", prompt, response, scope="cache_salt:b")
        finally:
            fresh.close()
        assert other == alone and default == alone
    finally:
        cache.close()


def test_put_finished_rejects_bad_ids_and_ignores_empty_output():
    cache = LookaheadCache(vocab_size=100)
    try:
        try:
            cache.put_finished([1, 2, 3], [5, 500])
        except ValueError as exc:
            assert "output" in str(exc)
        else:
            raise AssertionError("an id outside the vocabulary was accepted")
        cache.put_finished([1, 2, 3], [])
        cache.synchronize()
        assert cache.stats()["shared_tokens"] == 0
    finally:
        cache.close()


def _fleet_al(pairs, replicas: int, share: bool, lag: int = 1) -> float:
    drafter = FleetDrafter(replicas, share=share, lag=lag)
    try:
        return replay(drafter, pairs, 8).acceptance_length
    finally:
        drafter.close()


def test_fleet_loses_without_sharing_and_recovers_with_it():
    pairs = _pairs(24, seed=1)
    one = _fleet_al(pairs, 1, False)
    alone = _fleet_al(pairs, 4, False)
    shared = _fleet_al(pairs, 4, True, lag=1)
    instant = _fleet_al(pairs, 4, True, lag=0)
    assert alone < 0.9 * one, (alone, one)
    assert shared > 1.2 * alone, (shared, alone, one)  # the 2nd of 3 retries misses the 1st (lag 1)
    assert instant >= shared and abs(instant - one) <= 0.01 * one, (instant, one)


def test_publication_lag_is_counted_in_finished_requests():
    # The same request twice in a row, dealt to two replicas: the second
    # copy drafts from the first only if it was delivered before it started.
    pair = _pairs(1, seed=2)[0]
    pairs = [pair, pair]
    lag0 = _fleet_al(pairs, 2, True, lag=0)
    lag1 = _fleet_al(pairs, 2, True, lag=1)
    alone = _fleet_al(pairs, 2, False)
    assert lag1 == alone  # one finished request later: after the second one started
    assert lag0 > 1.5 * alone


def test_each_replica_gets_every_other_replicas_text():
    pairs = _pairs(8, seed=5)
    drafter = FleetDrafter(3, share=True, lag=0)
    try:
        replay(drafter, pairs, 8)
        assert drafter.delivered == 2 * len(pairs)
        tokens = [r.cache.stats()["shared_tokens"] for r in drafter.replicas]
        assert len(set(tokens)) == 1 and tokens[0] > 0
    finally:
        drafter.close()


def _write_trace(path: Path, pairs) -> None:
    with open(path, "w") as f:
        for prompt, response in pairs:
            f.write(json.dumps({"prompt": [int(t) for t in prompt], "response": [int(t) for t in response]}) + "\n")


def _cli(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "lookahead.replay", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_replicas_cli_prints_the_scaling_table(tmp_path):
    trace = tmp_path / "fleet.jsonl"
    _write_trace(trace, _pairs(18, seed=6))
    proc = _cli("--trace", str(trace), "--replicas", "1", "2", "4", "--share", "--out-dir", str(tmp_path / "out"),
                "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| fleet |")]
    assert [int(r[3]) for r in rows] == [1, 2, 4]
    assert "shared (lag 1)" in proc.stdout
    first = rows[0]
    assert first[6].strip() == "100.0 %" and first[8].strip() == "100.0 %"
    saved = json.loads((tmp_path / "out" / "fleet.json").read_text())
    assert saved["share_lag"] == 1 and [r["replicas"] for r in saved["rows"]] == [1, 2, 4]
    assert all(r["shared"] >= r["alone"] for r in saved["rows"])


def test_share_without_replicas_is_refused(tmp_path):
    trace = tmp_path / "t.jsonl"
    _write_trace(trace, _pairs(2))
    proc = _cli("--trace", str(trace), "--share")
    assert proc.returncode == 2 and "--share and --share-lag need --replicas" in proc.stderr
    proc = _cli("--trace", str(trace), "--replicas", "0")
    assert proc.returncode == 2 and "--replicas values must be >= 1" in proc.stderr
