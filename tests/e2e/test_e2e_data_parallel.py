"""LOOKAHEAD under data parallelism (``--dp-size 2``), in real SGLang on CPU.

SGLang's data-parallel controller starts one scheduler per replica, each
with its own worker and so its own trie, and dispatches requests between
them round robin. Each replica must speculate on its own share of the load
and answer as plain decoding does. SGLang binds each CPU rank to its own
cores (``SGLANG_CPU_OMP_THREADS_BIND``), one core per replica here.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import urllib.request

import pytest

from cpu_env import cpu_server_args
from lookahead.validate.server import SGLangServer

PROMPTS = [f"def function_{i}(x):\n    return x + {i}\n" * (2 + i % 3) for i in range(8)]


def _generate(url: str, prompt: str) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def _serve(model: str, args: list, env: dict, log) -> dict:
    srv = SGLangServer(model, args, env, log)
    srv.start(timeout=600)
    try:
        # All at once: the controller splits them between the replicas, four
        # each, within LOOKAHEAD's default max batch size.
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(lambda p: _generate(srv.url, p), PROMPTS))
    finally:
        srv.stop()
    return {"answers": answers, "log": log.read_text(errors="replace")}


@pytest.fixture(scope="module")
def runs(tiny_model, cpu_subprocess_env, tmp_path_factory):
    logs = tmp_path_factory.mktemp("dp")
    plain = _serve(tiny_model, cpu_server_args(disable_overlap_schedule=True, max_running_requests=8),
                   cpu_subprocess_env, logs / "plain.log")
    lookahead = _serve(
        tiny_model,
        cpu_server_args(max_running_requests=8) + [
            "--dp-size", "2", "--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", "4"],
        {**cpu_subprocess_env, "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}, logs / "lookahead_dp2.log")
    return plain, lookahead


def test_every_replica_runs_lookahead(runs):
    _, lookahead = runs
    for rank in ("DP0", "DP1"):
        assert re.search(rf"{rank}\] LOOKAHEAD worker: verify width 4", lookahead["log"]), rank
    assert "Traceback" not in lookahead["log"], lookahead["log"][-4000:]


def test_answers_identical_to_plain_decoding(runs):
    plain, lookahead = runs
    assert [a["output_ids"] for a in lookahead["answers"]] == [a["output_ids"] for a in plain["answers"]]


def test_the_replicas_speculate(runs):
    _, lookahead = runs
    metas = [a["meta_info"] for a in lookahead["answers"]]
    # Every request was verified with drafts, and the repetitive prompts' drafts were accepted.
    assert all(m["spec_verify_ct"] > 0 for m in metas), metas
    assert sum(m["completion_tokens"] for m in metas) > 1.3 * sum(m["spec_verify_ct"] for m in metas), metas
