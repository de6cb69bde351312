"""Saving the shared histories and loading them back: the same drafts, and clear errors."""

from __future__ import annotations

import dataclasses
import io
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

from lookahead import LookaheadCache, LookaheadConfig  # noqa: E402
from lookahead.trie._tuning import DraftTuning  # noqa: E402
from trie_helpers import open_cache  # noqa: E402


def _fill(cache, seed: int = 0, n: int = 30, vocab: int = 30) -> list:
    rng = random.Random(seed)
    streams = []
    for rid in range(n):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(5, 60))]
        out = [rng.randrange(vocab) for _ in range(rng.randint(5, 80))]
        cache.put_prompt(rid, prompt)
        cache.put_output(rid, out)
        cache.finish(rid)
        streams.append(prompt + out)
    cache.synchronize()
    return streams


def _probe_drafts(cache, streams, seed: int = 1) -> list:
    rng = random.Random(seed)
    out = []
    for i, stream in enumerate(streams):
        ctx = stream[: rng.randint(3, len(stream))]
        cache.put_prompt(("probe", i), ctx[-2:])
        cache.synchronize()
        for one_branch in (False, True):
            d = cache.draft(("probe", i), ctx, 10, one_branch)
            out.append((d.tokens, d.parents))
        cache.finish(("probe", i))
    return out


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "cache.npz"
    with open_cache(max_memory_bytes=1 << 18, share_prompt_tail=4) as cache:
        streams = _fill(cache)
        cache.save(path)
        before = _probe_drafts(cache, streams)
        shared_before = cache.stats()["shared_tokens"]
    loaded = LookaheadCache.load(path)
    try:
        assert loaded.config == LookaheadConfig(max_memory_bytes=1 << 18, share_prompt_tail=4)
        loaded.synchronize()
        assert loaded.stats()["shared_tokens"] == shared_before
        after = _probe_drafts(loaded, streams)
        assert after == before
        assert sum(bool(t) for t, _ in after) > len(after) // 2
        # Saving the loaded cache again gives the same history.
        loaded.save(tmp_path / "again.npz")
        with np.load(path) as a, np.load(tmp_path / "again.npz") as b:
            assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["lengths"], b["lengths"])
            assert len(a["tokens"]) == shared_before
    finally:
        loaded.close()


def test_save_load_keeps_the_tuning(tmp_path):
    """A saved cache loads with the tuning it drafted with (files written
    before the tuning had an entry of its own keep it among the options),
    unless the load is given another."""
    tuning = DraftTuning(copy_boost=0.0, wildcard_tokens=1)
    with open_cache(max_memory_bytes=1 << 16, tuning=tuning) as cache:
        streams = _fill(cache, n=5)
        cache.save(tmp_path / "new.npz")
        before = _probe_drafts(cache, streams)
    with np.load(tmp_path / "new.npz") as data:
        meta = json.loads(bytes(data["meta"]).decode())
        assert meta["tuning"] == dataclasses.asdict(tuning)
        old = {**meta, "config": {**meta["config"], **meta.pop("tuning")}}
        (tmp_path / "old.npz").write_bytes(_npz_bytes(tokens=data["tokens"], lengths=data["lengths"],
                                                      meta=_meta(**old)))
    for name in ("new.npz", "old.npz"):
        loaded = LookaheadCache.load(tmp_path / name)
        try:
            assert loaded._tuning == tuning
            assert _probe_drafts(loaded, streams) == before
        finally:
            loaded.close()
    other = LookaheadCache.load(tmp_path / "old.npz", tuning=DraftTuning())
    try:
        assert other._tuning == DraftTuning()
    finally:
        other.close()


def _npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _meta(**meta) -> np.ndarray:
    return np.frombuffer(json.dumps(meta).encode(), np.uint8)


def test_load_rejects_wrong_format_and_bad_ids(tmp_path):
    path = tmp_path / "cache.npz"
    with open_cache(max_memory_bytes=1 << 16) as cache:
        _fill(cache, n=3)
        cache.save(path)
    with np.load(path) as data:
        meta = json.loads(bytes(data["meta"]).decode())
    wrong = tmp_path / "wrong.npz"
    wrong.write_bytes(_npz_bytes(shared=np.arange(5, dtype=np.int32), meta=_meta(**{**meta, "format": 99})))
    with pytest.raises(ValueError, match="unsupported lookahead cache format 99"):
        LookaheadCache.load(wrong)
    for name, arrays in (("v1", dict(shared=np.array([-1, 5, -7], dtype=np.int32), meta=_meta(**{**meta, "format": 1}))),
                         ("v2", dict(tokens=np.array([-1, 5, -7], dtype=np.int32), lengths=np.array([3]),
                                     meta=_meta(**{**meta, "scopes": ["a"]})))):
        bad_ids = tmp_path / f"bad_ids_{name}.npz"
        bad_ids.write_bytes(_npz_bytes(**arrays))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            LookaheadCache.load(bad_ids)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        LookaheadCache.load(path, vocab_size=2)  # the saved history holds ids up to 29
    with pytest.raises(FileNotFoundError):
        LookaheadCache.load(tmp_path / "missing.npz")


def _corrupt(kind: str, good: bytes) -> bytes:
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "garbage":
        return b"definitely not a lookahead cache file\n" * 20
    if kind == "empty":
        return b""
    if kind == "missing-meta":
        return _npz_bytes(shared=np.arange(5, dtype=np.int32))
    if kind == "meta-not-json":
        return _npz_bytes(shared=np.arange(5, dtype=np.int32), meta=np.frombuffer(b"{{{", np.uint8))
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["meta-not-json", "truncated", "garbage", "empty", "missing-meta"])
def test_load_corrupted_file_raises_clear_error(tmp_path, kind):
    good = tmp_path / "good.npz"
    with open_cache(max_memory_bytes=1 << 16) as cache:
        _fill(cache, n=3)
        cache.save(good)
    bad = tmp_path / f"{kind}.npz"
    bad.write_bytes(_corrupt(kind, good.read_bytes()))
    with pytest.raises(ValueError) as info:
        LookaheadCache.load(bad)
    if kind != "meta-not-json":
        assert str(bad) in str(info.value)
