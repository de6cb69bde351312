"""Priority preemption with LOOKAHEAD: retracted requests resume losslessly.

With ``--enable-priority-scheduling`` a high-priority request that finds the
running batch full preempts lower-priority ones: SGLang releases their KV
(``release_req`` -> ``reset_for_retract``), puts them back in the queue, and
later prefills their prompt and output again. The trie's feed keeps such a
request (its ``rid`` is unchanged) and must neither feed its output twice nor
lose it; the verify flow must pick it up again from a fresh prefill. Real
servers on CPU (tiny model): plain decoding and LOOKAHEAD get the same
requests, every answer must be identical, and the low-priority requests must
really have been retracted on both (``meta_info["num_retractions"]``).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from cpu_env import cpu_server_args
from lookahead.validate.server import SGLangServer

LOW = [f"class Thing{i}:\n    def method(self, value):\n        return value * {i}\n" for i in range(3)]
HIGH = [f"import os\nprint(os.path.join('a', '{i}'))\n" for i in range(3)]
# Three running requests fill the batch; a priority gap of 50 preempts.
ARGS = dict(max_running_requests=3, max_total_tokens=8192, enable_priority_scheduling=True,
            priority_scheduling_preemption_threshold=0, enable_metrics=True)


def _post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _running(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("sglang:num_running_reqs{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _preempting_load(url: str) -> dict:
    """Three long low-priority requests; once all run, three high-priority ones."""
    answers = {}

    def ask(key, text, priority, n):
        answers[key] = _post(url + "/generate", {"text": text, "priority": priority, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}})

    low = [threading.Thread(target=ask, args=(("low", i), t, 0, 1500)) for i, t in enumerate(LOW)]
    for t in low:
        t.start()
    deadline = time.monotonic() + 120
    while _running(url) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    high = [threading.Thread(target=ask, args=(("high", i), t, 50, 40)) for i, t in enumerate(HIGH)]
    for t in high:
        t.start()
    for t in low + high:
        t.join()
    return answers


@pytest.fixture(scope="module")
def answers(tiny_model, cpu_subprocess_env, tmp_path_factory):
    out = {}
    logs = tmp_path_factory.mktemp("preemption")
    for name, extra in (("plain", ["--disable-overlap-schedule"]),
                        ("lookahead", ["--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", "8"])):
        srv = SGLangServer(tiny_model, cpu_server_args(**ARGS) + extra, cpu_subprocess_env, logs / f"{name}.log")
        srv.start(timeout=600)
        try:
            _post(srv.url + "/generate", {"text": "warm up", "sampling_params": {"max_new_tokens": 4}})
            out[name] = _preempting_load(srv.url)
            out[name + "_log"] = srv.log_tail(200_000)
        finally:
            srv.stop()
    return out


@pytest.mark.parametrize("server", ["plain", "lookahead"])
def test_low_priority_requests_were_preempted(answers, server):
    retractions = [answers[server][("low", i)]["meta_info"].get("num_retractions", 0) for i in range(3)]
    assert max(retractions) >= 1, retractions
    assert "Traceback" not in answers[server + "_log"]


def test_answers_identical_to_plain_decoding_after_preemption(answers):
    for key, plain in answers["plain"].items():
        got = answers["lookahead"][key]
        assert got["output_ids"] == plain["output_ids"], key
        assert len(got["output_ids"]) == (1500 if key[0] == "low" else 40)
