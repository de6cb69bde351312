"""``RequestFeed`` on SGLang's own ``Req`` objects: each request's scope
under every ``--speculative-lookahead-isolation`` mode, and what its drafts
can see as the feed drives the cache through a request's life (prefill,
output committed step by step, finish)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SGL_KERNEL_SHIM = REPO / "cpu" / "cpu_sgl_kernel"
try:  # schedule_batch imports sgl_kernel, which only the pure-torch stand-in provides on CPU
    import sgl_kernel  # noqa: F401
except ImportError:
    sys.path.insert(0, str(SGL_KERNEL_SHIM))

from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from lookahead import LookaheadCache  # noqa: E402
from lookahead.trie.config import ISOLATION_MODES  # noqa: E402
from lookahead.plugin.request_feed import RequestFeed  # noqa: E402

SECRET = list(range(3000, 3100))


def make_req(rid: str, prompt: list, **keys) -> Req:
    return Req(rid, "", list(prompt), SamplingParams(max_new_tokens=len(SECRET)), **keys)


def run(feed: RequestFeed, req: Req, output: list) -> None:
    """A request's life as the worker drives it: prefill, then a few tokens
    committed per step (synced before each draft), then its end."""
    feed.start([req])
    for i in range(0, len(output), 4):
        req.output_ids.extend(output[i:i + 4])
        feed.sync([req])
    req.finished_reason = FINISH_LENGTH(length=len(output))
    feed.sweep()


def drafted_secret(cache, feed: RequestFeed, rid: str, **keys) -> bool:
    """Whether a request knowing the secret's first 40 tokens is drafted its 41st."""
    req = make_req(rid, SECRET[:40], **keys)
    feed.start([req])
    cache.synchronize()
    (ready,) = feed.sync([req])
    hit = SECRET[40] in cache.draft(ready.rid, SECRET[:40], 4).tokens
    feed.finish(rid)
    return hit


@pytest.mark.parametrize("mode, expected", [
    ("salt", {"same salt": True, "other salt": False, "no keys": False, "same extra_key": False,
              "salt equal to the extra_key": False}),
    ("none", {"same salt": True, "other salt": True, "no keys": True, "same extra_key": True,
              "salt equal to the extra_key": True}),
    ("request", {"same salt": False, "other salt": False, "no keys": False, "same extra_key": False,
                 "salt equal to the extra_key": False}),
])
def test_what_a_request_drafts_from_under_each_mode(mode, expected):
    cache = LookaheadCache()
    finished = []
    feed = RequestFeed(cache, on_finish=finished.append, isolation=mode)
    try:
        run(feed, make_req("victim", [1, 2, 3], cache_salt="alice", extra_key="team"), SECRET)
        assert finished == ["victim"] and len(feed) == 0
        got = {
            "same salt": drafted_secret(cache, feed, "a", cache_salt="alice"),
            "other salt": drafted_secret(cache, feed, "b", cache_salt="mallory"),
            "no keys": drafted_secret(cache, feed, "c"),
            # The victim's salt decides its scope, not its extra_key...
            "same extra_key": drafted_secret(cache, feed, "d", extra_key="team"),
            # ... and a salt is never confused with an extra_key of the same text.
            "salt equal to the extra_key": drafted_secret(cache, feed, "e", extra_key="alice"),
        }
        assert got == expected
        histories = {"salt": {"cache_salt:alice"}, "none": {None}, "request": set()}[mode]
        assert set(cache.scope_stats()) == histories
    finally:
        cache.close()


def test_scope_of_follows_sglangs_keys():
    feed = RequestFeed(None, isolation="salt")
    assert feed.scope_of(make_req("r", [1], cache_salt="s", extra_key="k")) == ("cache_salt:s", True)
    assert feed.scope_of(make_req("r", [1], extra_key="k")) == ("extra_key:k", True)
    # A LoRA adapter is part of SGLang's extra_key, so it scopes unsalted requests.
    assert feed.scope_of(make_req("r", [1], lora_id="adapter")) == ("extra_key:adapter", True)
    # Empty keys are no keys (SGLang drops an empty salt; an empty extra_key stays "").
    assert feed.scope_of(make_req("r", [1], cache_salt="", extra_key="")) == (None, True)
    assert RequestFeed(None, isolation="none").scope_of(make_req("r", [1], cache_salt="s")) == (None, True)
    assert RequestFeed(None, isolation="request").scope_of(make_req("r", [1], cache_salt="s")) == (None, False)
    assert set(ISOLATION_MODES) == {"salt", "none", "request"}


def test_context_is_the_tail_of_prompt_output_and_pending():
    req = make_req("ctx", [1, 2, 3, 4, 5])
    assert RequestFeed.context_of(req, (), 3) == [3, 4, 5]
    req.output_ids.extend([6, 7])
    assert RequestFeed.context_of(req, (), 4) == [4, 5, 6, 7]
    assert RequestFeed.context_of(req, [8, 9], 3) == [7, 8, 9]
    assert RequestFeed.context_of(req, [8], 20) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_an_aborted_request_keeps_its_partial_output():
    # A partial rollout (aborted mid-answer, as slime aborts at a training
    # step's end) leaves what it wrote in the history: a later request drafts it.
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    cache = LookaheadCache(background=False)
    feed = RequestFeed(cache, isolation="none")
    req = make_req("partial", [1, 2, 3])
    feed.start([req])
    req.output_ids.extend(SECRET[:60])  # never synced: above the cut-off, or the abort came first
    req.finished_reason = FINISH_ABORT("aborted by the client")
    feed.sweep()
    assert "partial" not in feed
    assert cache.stats()["shared_tokens"] >= 60
    later = make_req("later", SECRET[:30])
    feed.start([later])
    (ready,) = feed.sync([later])
    assert SECRET[30] in cache.draft(ready.rid, SECRET[:30], 4).tokens


@pytest.mark.parametrize("mode", ISOLATION_MODES)
def test_each_finished_request_is_handed_on_with_its_scope(mode):
    """``on_text`` (what the fleet's share publishes) gets each finished
    request's prompt, whole output and scope once; under ``request``
    isolation nothing, as its text is shared with no one."""
    cache = LookaheadCache()
    try:
        feed = RequestFeed(cache, isolation=mode)
        handed = []
        feed.on_text = lambda prompt, output, scope: handed.append((list(prompt), list(output), scope))
        run(feed, make_req("a", [1, 2, 3], cache_salt="tenant-a"), SECRET[:10])
        run(feed, make_req("b", [4, 5]), SECRET[10:13])
        feed.finish("a")  # a second finish of the same request hands on nothing
        expected = {"salt": [([1, 2, 3], SECRET[:10], "cache_salt:tenant-a"), ([4, 5], SECRET[10:13], None)],
                    "none": [([1, 2, 3], SECRET[:10], None), ([4, 5], SECRET[10:13], None)],
                    "request": []}[mode]
        assert handed == expected
    finally:
        cache.close()
