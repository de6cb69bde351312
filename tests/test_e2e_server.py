"""A real ``python -m sglang.launch_server --speculative-algorithm LOOKAHEAD`` on CPU.

One server (tiny model, metrics on) serves every test here: an abort in the
middle of a generation must leave it serving others, ``/metrics`` must carry
LOOKAHEAD's metrics and they must move, and ``python -m sglang.bench_serving``
must run against it on a local ShareGPT-format file and report an accept
length.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from lookahead.testing.cpu_env import cpu_server_args
from lookahead.testing.server import SGLangServer

COPY_PROMPT = "import os\nimport sys\nimport os\nimport sys\nimport os\nimport sys\n"


def _post(url: str, payload: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return json.loads(body) if body.strip() else {}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


def _generate(base: str, text: str, max_new_tokens: int = 32, **extra) -> dict:
    return _post(base + "/generate", {"text": text, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}, **extra})


@pytest.fixture(scope="module")
def server(tiny_model, cpu_subprocess_env, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = cpu_server_args(max_running_requests=8, max_total_tokens=12288) + [
        "--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", "8",
        "--enable-metrics", "--log-level", "info",
    ]
    srv = SGLangServer(tiny_model, args, cpu_subprocess_env, log)
    srv.start(timeout=600)
    yield srv
    srv.stop()
    # Stopping cleanly is part of the contract: nothing of the server remains.
    assert srv.proc is None


def _metric(text: str, name: str, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_copy_heavy_request_is_accepted(server):
    out = _generate(server.url, COPY_PROMPT, 48)
    meta = out["meta_info"]
    assert meta["spec_verify_ct"] > 0
    assert meta["spec_accept_length"] > 1.5, meta
    assert meta["completion_tokens"] == 48


def test_abort_mid_generation_keeps_serving(server):
    expected = _generate(server.url, "def add(a, b):\n    return", 24)["output_ids"]
    finished = {}

    def long_request():
        try:
            finished["out"] = _post(server.url + "/generate", {
                "text": "the cat the cat the cat", "rid": "to-abort",
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 4000, "ignore_eos": True}})
        except Exception as exc:  # the connection may be cut by the abort
            finished["error"] = repr(exc)

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(3.0)  # let it get into decoding
    _post(server.url + "/abort_request", {"rid": "to-abort"})
    t.join(timeout=120)
    assert not t.is_alive(), "the aborted request never returned"
    if "out" in finished:
        meta = finished["out"]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
        assert meta["completion_tokens"] < 4000
    # The server is still healthy and still lossless for the next requests.
    assert _get(server.url + "/health") is not None
    again = _generate(server.url, "def add(a, b):\n    return", 24)
    assert again["output_ids"] == expected
    assert again["meta_info"]["spec_verify_ct"] > 0


def test_metrics_are_exported_and_move(server):
    before = _get(server.url + "/metrics")
    assert "sglang:lookahead_steps_total" in before, before[:2000]
    steps0 = _metric(before, "sglang:lookahead_steps_total")
    accept0 = _metric(before, "sglang:lookahead_accept_length_count")
    prompt0 = _metric(before, "sglang:lookahead_prompt_tokens_indexed_total")
    for i in range(3):
        _generate(server.url, COPY_PROMPT + f"# {i}\n", 40)
    time.sleep(1.5)  # trie gauges refresh at most once a second
    _generate(server.url, "x = 1\n", 8)
    after = _get(server.url + "/metrics")
    assert _metric(after, "sglang:lookahead_steps_total") > steps0
    assert _metric(after, "sglang:lookahead_steps_total", reason="verify") > 0
    assert _metric(after, "sglang:lookahead_accept_length_count") > accept0
    assert _metric(after, "sglang:lookahead_accept_length_sum") > _metric(after, "sglang:lookahead_accept_length_count")
    drafts_observed = _metric(after, "sglang:lookahead_draft_seconds_count")
    assert drafts_observed > 0
    assert _metric(after, "sglang:lookahead_prompt_tokens_indexed_total") > prompt0
    assert _metric(after, "sglang:lookahead_trie_bytes") > 0
    assert _metric(after, "sglang:lookahead_trie_nodes") > 0


def test_bench_serving_reports_accept_length(server, tiny_model, cpu_subprocess_env, tmp_path):
    rows = []
    for i in range(8):
        body = COPY_PROMPT * (1 + i % 3)
        rows.append({"conversations": [{"from": "human", "value": f"Repeat:\n{body}"},
                                       {"from": "gpt", "value": body}]})
    dataset = tmp_path / "local_sharegpt.json"
    dataset.write_text(json.dumps(rows))
    out = tmp_path / "bench.jsonl"
    proc = subprocess.run([
        sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.url,
        "--model", tiny_model, "--tokenizer", tiny_model, "--dataset-name", "sharegpt",
        "--dataset-path", str(dataset), "--num-prompts", "8", "--sharegpt-output-len", "32",
        "--max-concurrency", "2", "--output-file", str(out), "--disable-tqdm",
    ], env=cpu_subprocess_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["completed"] == 8
    assert record["accept_length"] and record["accept_length"] > 1.0, record.get("accept_length")
    assert re.search(r"Accept length:\s+[0-9.]+", proc.stdout)
