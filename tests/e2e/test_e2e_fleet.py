"""A fleet drafts as one: two real CPU SGLang servers (SmolLM2-135M-Instruct)
behind ``sglang-router`` (round robin), sharing LOOKAHEAD's history through
a real ``redis-server`` (``--speculative-lookahead-share``, with a
password), all started here on free localhost ports and killed after.

* A question answered on one replica is drafted from on the other: its
  acceptance length there, against the same question's in a scope that
  has seen nothing (what the other replica drafts without sharing).
* A second tenant (another ``cache_salt``) never drafts from the first
  tenant's text on any replica (the drafts each server logs,
  ``LOOKAHEAD_DRAFT_LOG``), while the first tenant does on both.
* A corpus added over HTTP on one replica reaches the other, scoped as
  added, and so does its removal; a corpus request whose body is not JSON
  gets HTTP 400 with a message.
* Redis killed and restarted under load: no request fails, both replicas
  serve throughout, and text published after the restart arrives.

The servers are shared by every test of the module (start-up dominates).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cpu_env import cpu_server_args
from draft_paths import drafts_with_own_streams, unexplained_paths
from lookahead.trie.draft_log import DRAFT_LOG_ENV
from lookahead.validate.server import SGLangServer, free_port
from redis_server import RedisServer, redis_server_binary

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server is not installed (make test installs it: apt-get install "
                                       "redis-server)")

PASSWORD = "fleet-test-password"
MODEL_NAME = "fleet-smollm"
MAX_NEW = 48
FIGURES: dict = {}  # what the docs quote; also written to .cache/fleet_e2e.json
QUESTIONS = [
    "What is the capital of France, and what is it known for?",
    "Explain in two sentences what a hash table is.",
    "Give three tips for writing readable Python code.",
    "Why is the sky blue? Answer briefly.",
]


def _chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def _post(url: str, body, timeout: float = 600):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


def _generate(url: str, question, salt: str, rid: str | None = None, max_new: int = MAX_NEW) -> dict:
    """``question``: text (rendered as a chat turn) or the prompt's token ids."""
    body = {"cache_salt": salt, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new,
                                                     "ignore_eos": True}}
    if isinstance(question, str):
        body["text"] = _chat(question)
    else:
        body["input_ids"] = list(question)
    if rid:
        body["rid"] = rid
    return _post(url + "/generate", body)


def _al(out: dict) -> float:
    meta = out["meta_info"]
    return meta["completion_tokens"] / max(1, meta["spec_verify_ct"])


def _share_count(server: SGLangServer, what: str) -> float:
    total = 0.0
    for line in _get(server.url + "/metrics").splitlines():
        if line.startswith("sglang:lookahead_share_entries{") and f'what="{what}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait(cond, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _received_more(server: SGLangServer, before: float, n: int = 1):
    return lambda: _share_count(server, "received") >= before + n


@pytest.fixture(scope="module")
def fleet(real_model, cpu_subprocess_env, tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    broker = RedisServer(work / "redis", password=PASSWORD).start()
    servers, router = [], None
    try:
        for name in ("a", "b"):
            args = cpu_server_args(max_running_requests=4) + [
                "--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", "8",
                "--speculative-lookahead-share", broker.url(), "--served-model-name", MODEL_NAME,
                "--enable-metrics", "--log-level", "info"]
            env = {**cpu_subprocess_env, DRAFT_LOG_ENV: str(work / f"drafts-{name}.jsonl")}
            servers.append(SGLangServer(real_model, args, env, work / f"server-{name}.log"))
        with cf.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(timeout=600), servers))
        port = free_port()
        router_log = open(work / "router.log", "w")
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", *[s.url for s in servers], "--policy", "round_robin", "--log-level", "warn"],
            stdout=router_log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"

        def router_up():
            try:
                return urllib.request.urlopen(url + "/health", timeout=5).status == 200
            except (urllib.error.URLError, OSError):
                return router.poll() is not None
        _wait(router_up, 120, "the router")
        assert router.poll() is None, (work / "router.log").read_text()[-3000:]
        yield {"a": servers[0], "b": servers[1], "router": url, "broker": broker, "work": work}
    finally:
        if router is not None:
            router.kill()
            router.wait(timeout=10)
        for s in servers:
            s.stop()
        broker.stop()
        if FIGURES:
            out = Path(__file__).resolve().parents[2] / ".cache" / "fleet_e2e.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(FIGURES, indent=1))
            print("\nfleet figures:", json.dumps(FIGURES))
    for s in servers:
        assert s.proc is None


def test_an_answer_served_on_one_replica_is_drafted_from_on_the_other(fleet):
    a, b = fleet["a"], fleet["b"]
    first, other = [], []
    for i, q in enumerate(QUESTIONS):
        salt = f"qa-{i}"
        before = _share_count(b, "received")
        first.append(_generate(a.url, q, salt))
        _wait(_received_more(b, before), what="the answer to reach the other replica")
        other.append(_generate(b.url, q, salt))
    for x, y in zip(first, other):
        assert x["output_ids"] == y["output_ids"]  # greedy, float32: the same answer on both
    al_first = sum(_al(o) for o in first) / len(first)  # a scope that has seen nothing: no sharing
    al_other = sum(_al(o) for o in other) / len(other)
    FIGURES["direct"] = {"al_first": al_first, "al_other_replica": al_other, "ratio": al_other / al_first}
    assert al_other >= 1.5 * al_first, FIGURES["direct"]


def test_through_the_router_the_second_ask_lands_on_the_other_replica_and_drafts(fleet):
    """Round robin: each question asked twice in a row goes to one replica,
    then the other; the second ask drafts from the first's answer."""
    a, b = fleet["a"], fleet["b"]
    firsts, seconds = [], []
    for i, q in enumerate(QUESTIONS):
        salt = f"router-{i}"
        before = _share_count(a, "received") + _share_count(b, "received")
        firsts.append(_generate(fleet["router"], q, salt))
        _wait(lambda: _share_count(a, "received") + _share_count(b, "received") >= before + 1,
              what="the answer to reach the other replica")
        seconds.append(_generate(fleet["router"], q, salt))
    al1 = sum(map(_al, firsts)) / len(firsts)
    al2 = sum(map(_al, seconds)) / len(seconds)
    FIGURES["router"] = {"al_first": al1, "al_second": al2, "ratio": al2 / al1}
    assert al2 >= 1.5 * al1, FIGURES["router"]
    lags = {name: _get(s.url + "/metrics") for name, s in (("a", a), ("b", b))}
    FIGURES["lag_ms"] = {name: [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                if line.startswith("sglang:lookahead_share_lag_ms{")]
                         for name, text in lags.items()}


def _records(fleet, name: str) -> list:
    path = fleet["work"] / f"drafts-{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_second_tenant_never_drafts_from_the_first_tenants_text(fleet, real_model):
    """Alice's answer, served on replica a, reaches b in her scope only: on
    either replica, another tenant asking the same question for the first
    time (Bob on b, Carol on a) drafts from its own prompt and output alone,
    while Alice on b drafts from her answer on a too.  (Bob and Carol are
    two tenants: the same one on both replicas would draft from its own
    first answer, which is word for word Alice's.)"""
    from transformers import AutoTokenizer

    a, b = fleet["a"], fleet["b"]
    prompt = AutoTokenizer.from_pretrained(real_model).encode(
        _chat("Describe the water cycle in three short steps."), add_special_tokens=False)
    before = _share_count(b, "received")
    alice = _generate(a.url, prompt, "alice", rid="fleet-alice-a")
    _wait(_received_more(b, before), what="alice's text on the other replica")
    runs = {("b", "fleet-bob-b"): _generate(b.url, prompt, "bob", rid="fleet-bob-b"),
            ("a", "fleet-carol-a"): _generate(a.url, prompt, "carol", rid="fleet-carol-a"),
            ("b", "fleet-alice-b"): _generate(b.url, prompt, "alice", rid="fleet-alice-b")}
    for (name, rid), out in runs.items():
        records = _records(fleet, name)
        mine = [r for r in records if r["rid"] == rid]
        assert mine and {r["scope"] for r in mine} == {f"cache_salt:{rid.split('-')[1]}"}
        own_drafts = drafts_with_own_streams(records, rid, prompt)
        may_see = [list(prompt) + alice["output_ids"]] if "alice" in rid else []
        from_alice = 0
        for rec, own in own_drafts:
            draft = (rec["tokens"], rec["parents"])
            assert not unexplained_paths(draft, rec["context"], [own] + may_see), (rid, rec)
            from_alice += bool(unexplained_paths(draft, rec["context"], [own]))
        if "alice" in rid:
            assert from_alice > 0 and _al(out) > _al(runs[("b", "fleet-bob-b")]), rid
        else:
            assert from_alice == 0, rid


def test_corpora_reach_every_replica_and_bad_bodies_get_400(fleet):
    a, b = fleet["a"], fleet["b"]
    for path in ("/add_external_corpus", "/remove_external_corpus"):
        for body in (b"{not json", b"[1, 2]"):
            req = urllib.request.Request(a.url + path, body, {"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=60)
            assert err.value.code == 400, (path, body)
            message = json.loads(err.value.read())["message"]
            assert "JSON object" in message, message
    added = _post(a.url + "/add_external_corpus", {"corpus_id": "manual", "scope": "cache_salt:corp",
                                                   "documents": ["Press and hold the reset button for ten "
                                                                 "seconds until the light blinks green."]})
    assert added["success"], added

    def listed(server):
        return json.loads(_get(server.url + "/list_external_corpora"))

    _wait(lambda: listed(b)["corpus_token_counts"].get("manual") == added["loaded_token_count"],
          what="the whole corpus on the other replica")
    assert "scope cache_salt:corp" in listed(b)["message"]
    removed = _post(a.url + "/remove_external_corpus", {"corpus_id": "manual"})
    assert removed["success"], removed
    _wait(lambda: "manual" not in listed(b)["corpus_token_counts"], what="the removal on the other replica")
    assert _generate(b.url, "Hello!", "corp", max_new=8)["meta_info"]["completion_tokens"] == 8


def test_redis_restart_under_load_fails_no_request(fleet):
    a, b, broker = fleet["a"], fleet["b"], fleet["broker"]
    failures, served = [], {"a": 0, "b": 0}
    stop = threading.Event()
    lock = threading.Lock()

    def load(name, server, worker):
        i = 0
        while not stop.is_set():
            try:
                out = _generate(server.url, f"Count from {worker} to {worker + 5}, item {i}.", f"load-{worker}",
                                max_new=12)
                assert out["meta_info"]["completion_tokens"] == 12
                with lock:
                    served[name] += 1
            except Exception as exc:  # every failure is reported below
                failures.append(f"{name}: {exc!r}")
            i += 1

    threads = [threading.Thread(target=load, args=(n, s, k)) for k, (n, s) in enumerate((("a", a), ("b", b)))]
    router_outs = []
    for t in threads:
        t.start()
    try:
        time.sleep(3)
        broker.stop()
        down_at = dict(served)
        router_outs += [_generate(fleet["router"], "Name two rivers in Europe.", "during", max_new=16)
                        for _ in range(2)]
        time.sleep(6)  # serving on, the replicas retrying with backoff
        during = {k: served[k] - down_at[k] for k in served}
        broker.start()
        # After the restart: new text crosses again.
        before = _share_count(b, "received")
        q = "List the planets of the solar system in order."
        after_restart = _generate(a.url, q, "after")
        _wait(_received_more(b, before), 90, "text published after the restart")
        again = _generate(b.url, q, "after")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert not failures, failures
    assert all(n > 0 for n in during.values()), during  # both replicas served while Redis was down
    assert all(o["meta_info"]["completion_tokens"] == 16 for o in router_outs)
    assert again["output_ids"] == after_restart["output_ids"]
    assert _al(again) >= 1.5 * _al(after_restart)
    FIGURES["restart"] = {"served_while_down": during, "al_before_after": [_al(after_restart), _al(again)]}
    for s in (a, b):
        assert _share_count(s, "outages") >= 1
        assert "LOOKAHEAD share: cannot reach" in s.log_tail(10**7)
        assert PASSWORD not in s.log_tail(10**7)
