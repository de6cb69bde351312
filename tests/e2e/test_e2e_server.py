"""A real ``python -m sglang.launch_server --speculative-algorithm LOOKAHEAD`` on CPU.

One server (tiny model, metrics on) serves every test here: an abort in the
middle of a generation must leave it serving others, ``/metrics`` must carry
LOOKAHEAD's metrics and they must move, ``python -m sglang.bench_serving``
must run against it on a local ShareGPT-format file and report an accept
length, and ``/generate`` and the OpenAI completions endpoint must carry
the ``cache_salt`` / ``extra_key`` that scope a request's drafts (checked in
the drafts the server logs, ``LOOKAHEAD_DRAFT_LOG``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from draft_paths import drafts_with_own_streams, unexplained_paths
from lookahead.trie.draft_log import DRAFT_LOG_ENV
from cpu_env import cpu_server_args
from lookahead.validate.server import SGLangServer

COPY_PROMPT = "import os\nimport sys\nimport os\nimport sys\nimport os\nimport sys\n"


def _post(url: str, payload: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return json.loads(body) if body.strip() else {}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


def _status(url: str) -> int:
    """The HTTP status of a GET (an error status is returned, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


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
    env = {**cpu_subprocess_env, DRAFT_LOG_ENV: str(log.with_name("drafts.jsonl"))}
    srv = SGLangServer(tiny_model, args, env, log)
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
    # /health_generate runs a one-token generation through the scheduler (and
    # LOOKAHEAD's worker) and answers 503 if it gets no answer; /health alone
    # answers 200 without asking the scheduler.
    assert _status(server.url + "/health_generate") == 200
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


def _drafts_logged(server) -> list:
    return [json.loads(line) for line in server.log_path.with_name("drafts.jsonl").read_text().splitlines()]


def test_both_apis_carry_the_keys_that_scope_drafts(server, tiny_model):
    """A text generated through /generate with an ``extra_key``, then asked
    to be continued (its prompt and first 40 tokens) through
    /v1/completions: under another request's ``cache_salt`` no draft comes
    from it, under the same ``extra_key`` drafts do; and /generate carries a
    ``cache_salt`` too."""
    prompt = [55, 325, 279, 294, 971, 979, 262, 1023, 76, 388, 300, 89, 1105]
    sampling = {"temperature": 0.0, "max_new_tokens": 96, "ignore_eos": True}
    first = _post(server.url + "/generate", {"input_ids": prompt, "sampling_params": sampling,
                                             "extra_key": "team-x", "rid": "iso-first"})["output_ids"]
    lead = prompt + first[:40]
    for rid, keys in (("iso-salted", {"cache_salt": "iso-other"}), ("iso-team", {"extra_key": "team-x"})):
        body = {"model": tiny_model, "prompt": lead, "max_tokens": 40, "temperature": 0.0, "ignore_eos": True,
                "rid": rid, **keys}
        text = _post(server.url + "/v1/completions", body)["choices"][0]["text"]
        assert text
    _post(server.url + "/generate", {"input_ids": lead, "sampling_params": {**sampling, "max_new_tokens": 16},
                                     "cache_salt": "iso-third", "rid": "iso-third"})
    records = _drafts_logged(server)
    scopes = {r["rid"]: r["scope"] for r in records if r["rid"].startswith("iso-")}
    assert scopes == {"iso-first": "extra_key:team-x", "iso-salted": "cache_salt:iso-other",
                      "iso-team": "extra_key:team-x", "iso-third": "cache_salt:iso-third"}
    first_stream = prompt + first
    for rid, may_see in (("iso-salted", []), ("iso-team", [first_stream]), ("iso-third", [])):
        drafts = drafts_with_own_streams(records, rid, lead)
        assert drafts, rid
        from_first = 0
        for rec, own in drafts:
            assert not unexplained_paths((rec["tokens"], rec["parents"]), rec["context"], [own] + may_see), rec
            from_first += bool(unexplained_paths((rec["tokens"], rec["parents"]), rec["context"], [own]))
        assert (from_first > 0) == bool(may_see), (rid, from_first)
