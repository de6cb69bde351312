"""``lookahead.plugin.share`` against a real ``redis-server``: text reaches
the other replica in its scope and only there, a new replica starts warm,
bad entries are skipped and counted, the stream is capped, authentication
is honoured and the password never logged, and a broker that goes away and
comes back costs nothing but a counted, bounded queue."""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
import pytest

from lookahead.plugin import share as share_mod
from lookahead.plugin.share import FleetShare, check_url, mask_url
from lookahead.trie.cache import LookaheadCache
from redis_server import RedisServer, redis_server_binary

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server is not installed (make test installs it: apt-get install "
                                       "redis-server)")

PASSWORD = "s3cret-pw-for-tests"
VOCAB = 1000


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis"), password=PASSWORD) as server:
        yield server


def _wait(cond, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


class Replica:
    """A cache and its FleetShare, closed together."""

    def __init__(self, url: str, model: str, **kwargs):
        self.cache = LookaheadCache(vocab_size=VOCAB)
        self.share = FleetShare(url, model, self.cache, vocab=VOCAB, **kwargs).start()

    def close(self):
        self.share.close()
        self.cache.close()


@pytest.fixture
def replicas(request):
    made = []

    def make(url, model=None, **kwargs):
        r = Replica(url, model or request.node.name, **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def _text(seed: int, n: int = 80):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB - 1, size=30).astype(np.int32), rng.integers(0, VOCAB - 1, size=n).astype(np.int32)


def _drafted(cache: LookaheadCache, prompt, output, scope) -> int:
    """Draft tokens a request with this prompt gets at its first steps, fed
    the recorded output (0 where nothing it may read holds the output)."""
    rid = object()
    cache.put_prompt(rid, prompt, scope=scope)
    cache.synchronize()
    total, context = 0, list(prompt)
    for tok in output[:20]:
        draft = cache.draft(rid, np.asarray(context, np.int32), 8)
        total += sum(1 for i, t in enumerate(draft.tokens) if draft.parents[i] == -1 and t == tok)
        cache.put_output(rid, [int(tok)])
        context.append(int(tok))
    cache.finish(rid)
    return total


def test_text_reaches_the_other_replica_in_its_scope_only(broker, replicas):
    a, b = replicas(broker.url()), replicas(broker.url())
    prompt, output = _text(1)
    a.share.publish_text(prompt.tolist(), output.tolist(), "cache_salt:alice")
    assert _wait(lambda: b.share.stats()["received"] == 1), b.share.stats()
    assert a.share.stats()["published"] == 1
    time.sleep(0.3)
    assert a.share.stats()["received"] == 0  # its own entry is skipped
    assert _drafted(b.cache, prompt, output, "cache_salt:alice") >= 15
    assert _drafted(b.cache, prompt, output, "cache_salt:bob") == 0
    assert _drafted(b.cache, prompt, output, None) == 0
    stats = b.share.stats()
    assert stats["lag_ms_p50"] >= 0 and stats["lag_ms_p99"] >= stats["lag_ms_p50"]


def test_a_new_replica_starts_with_the_recent_history(broker, replicas):
    a = replicas(broker.url())
    texts = [_text(10 + i) for i in range(5)]
    for prompt, output in texts:
        a.share.publish_text(prompt.tolist(), output.tolist(), None)
    assert _wait(lambda: a.share.stats()["published"] == 5)
    late = replicas(broker.url())  # started after the fact
    assert _wait(lambda: late.share.stats()["received"] == 5), late.share.stats()
    assert all(_drafted(late.cache, p, o, None) >= 15 for p, o in texts)


def test_malformed_and_foreign_entries_are_skipped_and_counted(broker, replicas):
    model = "bad-entries"
    b = replicas(broker.url(), model)
    client = broker.client()
    stream = share_mod.stream_name(model)
    good = {b"v": b"1", b"kind": b"text", b"replica": b"elsewhere", b"group": b"", b"vocab": str(VOCAB).encode(),
            b"scope": b"null", b"t": repr(time.time()).encode(), b"prompt": np.arange(5, dtype="<i4").tobytes(),
            b"output": np.arange(5, 25, dtype="<i4").tobytes()}
    foreign = [{b"hello": b"world"}, {**good, b"v": b"2"}, {**good, b"kind": b"other"},
               {**good, b"vocab": b"32000"}]
    malformed = [{**good, b"scope": b"{not json"}, {**good, b"scope": b"[1, 2]"},
                 {**good, b"output": b"\x01\x02\x03"},  # not whole int32s
                 {**good, b"output": np.array([5, VOCAB + 7], dtype="<i4").tobytes()},  # outside the vocabulary
                 {**good, b"output": np.array([5, -3], dtype="<i4").tobytes()},
                 {k: v for k, v in good.items() if k != b"prompt"}, {**good, b"t": b"soon"},
                 {**good, b"replica": b""}]
    for fields in foreign + malformed + [good]:
        client.xadd(stream, fields)
    assert _wait(lambda: b.share.stats()["received"] == 1), b.share.stats()
    stats = b.share.stats()
    assert stats["foreign"] == len(foreign) and stats["malformed"] == len(malformed), stats
    b.cache.synchronize()
    # Only the good entry's output is in the history: 20 tokens, a separator and the prompt's tail.
    assert 21 <= b.cache.stats()["shared_tokens"] <= 21 + 6


def test_the_stream_is_capped(broker, replicas):
    a = replicas(broker.url(), "capped", maxlen=50)
    for i in range(600):
        a.share.publish_text([1, 2, 3], [4, 5, i % VOCAB], None)
    assert _wait(lambda: a.share.stats()["published"] == 600)
    length = broker.client().xlen(share_mod.stream_name("capped"))
    # MAXLEN ~ trims whole stream nodes (100 entries each by default).
    assert 50 <= length <= 50 + 100, length


def test_authentication_is_honoured_and_the_password_never_logged(broker, replicas, caplog):
    caplog.set_level(logging.INFO, logger="lookahead.plugin.share")
    wrong = replicas(broker.url(password="not-the-password"), "auth")
    wrong.share.publish_text([1, 2], [3, 4, 5], None)
    assert _wait(lambda: wrong.share.stats()["outages"] >= 1)
    assert wrong.share.stats()["published"] == 0
    right = replicas(broker.url(), "auth")
    right.share.publish_text([1, 2], [3, 4, 5], None)
    assert _wait(lambda: right.share.stats()["published"] == 1)
    text = caplog.text
    assert "cannot reach" in text and "***" in text
    assert PASSWORD not in text and "not-the-password" not in text
    assert mask_url(broker.url()) == f"redis://default:***@127.0.0.1:{broker.port}/0"


def test_broker_down_then_back_catches_up(tmp_path, replicas, caplog):
    caplog.set_level(logging.INFO, logger="lookahead.plugin.share")
    server = RedisServer(tmp_path / "redis").start()
    try:
        a = replicas(server.url(), "restart", queue_entries=8)
        b = replicas(server.url(), "restart")
        a.share.publish_text([1, 2, 3], [7, 8, 9], None)
        assert _wait(lambda: b.share.stats()["received"] == 1)
        server.stop()
        for i in range(12):  # 4 more than the queue holds
            a.share.publish_text([1, 2, 3], [10 + i, 11, 12], None)
        assert _wait(lambda: a.share.stats()["down"] and b.share.stats()["down"])
        assert a.share.stats()["dropped"] == 4
        server.start()  # empty: no persistence
        assert _wait(lambda: b.share.stats()["received"] == 1 + 8, timeout=30), (a.share.stats(), b.share.stats())
        a.share.publish_text([1, 2, 3], [50, 51, 52], None)  # published after the restart
        assert _wait(lambda: b.share.stats()["received"] == 10)
        assert not a.share.stats()["down"] and not b.share.stats()["down"]
        # Logged once per outage, not once per retry.
        assert caplog.text.count("cannot reach") == 2  # once per replica
        assert "reachable again" in caplog.text
    finally:
        server.stop()


def test_an_insert_that_raises_never_stops_the_reader(broker, replicas):
    b = replicas(broker.url(), "raising")
    original = b.cache.put_finished
    calls = []

    def flaky(prompt, output, scope=None):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return original(prompt, output, scope=scope)

    b.cache.put_finished = flaky
    a = replicas(broker.url(), "raising")
    a.share.publish_text([1, 2], [3, 4, 5], None)
    a.share.publish_text([1, 2], [6, 7, 8], None)
    assert _wait(lambda: b.share.stats()["received"] == 1 and b.share.stats()["errors"] == 1), b.share.stats()
    assert all(t.is_alive() for t in b.share._threads)


def test_corpus_control_entries_reach_other_servers_only(broker, replicas):
    a = replicas(broker.url(), "corpora", group="server-1")
    same_server = replicas(broker.url(), "corpora", group="server-1")
    other = replicas(broker.url(), "corpora", group="server-2")
    chunks = [[5, 6, 7, 8], [9, 10, -2**31, 11]]
    a.share.publish_corpus_add("docs", chunks, "cache_salt:alice")
    assert _wait(lambda: other.share.stats()["corpora_added"] == 1), other.share.stats()
    assert _wait(lambda: other.cache.corpora().get("docs", {}).get("state") == "ready")
    info = other.cache.corpora()["docs"]
    here = LookaheadCache(vocab_size=VOCAB)
    try:
        added_here = here.add_corpus("docs", chunks, "cache_salt:alice")
    finally:
        here.close()
    assert info["scope"] == "cache_salt:alice" and info["tokens"] == added_here  # the same token stream
    time.sleep(0.3)
    assert "docs" not in same_server.cache.corpora()  # its server gave it to every rank itself
    a.share.publish_corpus_remove("docs")
    assert _wait(lambda: "docs" not in other.cache.corpora())


def test_url_checks_and_the_missing_client(monkeypatch):
    for bad, why in (("http://h:6379", "must start with redis://"), ("redis://", "needs a host"),
                     ("redis://h:6379/x", "database number"), ("redis://h:99999/0", "Redis URL"), ("", "Redis URL")):
        with pytest.raises(ValueError, match=why):
            check_url(bad, "--speculative-lookahead-share")
    with pytest.raises(ValueError) as exc:
        check_url("ftp://u:topsecret@h:1/0", "--speculative-lookahead-share")
    assert "topsecret" not in str(exc.value) and "***" in str(exc.value)
    assert check_url("redis://u:p@h:6379/2") == "redis://u:p@h:6379/2"
    assert mask_url("redis://h:6379/0") == "redis://h:6379/0"
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(share_mod.ShareUnavailable, match=r"pip install 'sglang-lookahead\[share\]'"):
        share_mod.require_client()


def test_start_for_worker_wires_the_feed_and_honours_request_isolation(broker):
    """The worker's hook: its finished requests (through ``RequestFeed``)
    reach another replica's trie; ``request`` isolation shares nothing."""
    from types import SimpleNamespace

    from lookahead.plugin.request_feed import RequestFeed
    from lookahead.plugin.share import NoShare, start_for_worker

    def worker(isolation):
        cache = LookaheadCache(vocab_size=VOCAB)
        args = SimpleNamespace(share=broker.url(), share_maxlen=100, isolation=isolation)
        return SimpleNamespace(args=args, cache=cache, feed=RequestFeed(cache, isolation=isolation))

    server_args = SimpleNamespace(served_model_name="wired", model_path="/m", port=1, enable_metrics=False)
    a, b, private = worker("salt"), worker("salt"), worker("request")
    shares = [start_for_worker(w, server_args) for w in (a, b, private)]
    try:
        assert isinstance(shares[2], NoShare) and private.feed.on_text is None
        prompt, output = _text(7)
        req = SimpleNamespace(rid="r1", origin_input_ids=prompt.tolist(), origin_input_ids_unpadded=None,
                              output_ids=[], cache_salt="t", extra_key=None, sampling_params=None,
                              finished=lambda: True)
        a.feed.start([req])
        req.output_ids.extend(output.tolist())
        a.feed.sync([req])
        a.feed.finish("r1")
        assert _wait(lambda: shares[1].stats()["received"] == 1), shares[1].stats()
        assert _drafted(b.cache, prompt, output, "cache_salt:t") >= 15
        assert shares[0].stats_entry()["share"]["published"] == 1 and NoShare().stats_entry() == {}
    finally:
        for s in shares:
            s.close()
        for w in (a, b, private):
            w.cache.close()
