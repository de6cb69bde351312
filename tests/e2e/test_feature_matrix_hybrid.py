"""The feature matrix of ``feature_matrix.py`` for LOOKAHEAD + EAGLE.

Real ``python -m sglang.launch_server`` processes on CPU serving the bigram
target (``eagle_fixtures``): plain decoding, then EAGLE
with ``--speculative-lookahead-hybrid``, with trees (top-k 2, width 6) and
with chains (top-k 1, width 4), the noisy head. Each serves the whole matrix
once; the answers must equal plain decoding's case by case: structured
output (regex, JSON schema, EBNF, OpenAI response format), logprobs at
batch sizes 1, 4 and 6 and from the prompt start, stops, ``n``, streaming,
abort, a prompt longer than the chunked prefill and 16 concurrent requests.

Not compared: the penalty cases and ``min_new_tokens``. SGLang's EAGLE
applies penalties once per verify step (its "relaxed" penalties), so its
output there depends on how many tokens each step accepted and differs from
plain decoding with or without the trie; the hybrid keeps EAGLE's behaviour.
Nor the custom logit processor case: SGLang's EAGLE verify does not apply
custom logit processors at all.
"""

from __future__ import annotations

import pytest

from lookahead.validate import feature_matrix as fm
from cpu_env import cpu_server_args, default_cache_dir
from test_feature_matrix import _start, plain_reference

BASE = dict(max_running_requests=16, max_total_tokens=24576, chunked_prefill_size=256,
            enable_custom_logit_processor=True,
            constrained_json_disable_any_whitespace=True)
# EAGLE's relaxed penalties, and no custom logit processors (see the module docstring).
NOT_COMPARED = {"frequency_penalty", "presence_penalty", "repetition_penalty", "penalties_combined", "min_new_tokens",
                "custom_logit_processor"}
COMPARED = [c for c in fm.COMPARED if c not in NOT_COMPARED]
CONFIGS = {
    "hybrid-tree": ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                    "--speculative-num-draft-tokens", "6"],
    "hybrid-chain": ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", "4"],
}


@pytest.fixture(scope="module")
def fixture_models():
    from eagle_fixtures import build_fixtures

    return build_fixtures(default_cache_dir() / "eagle")


@pytest.fixture(scope="module")
def plain(fixture_models, cpu_subprocess_env, tmp_path_factory):
    return plain_reference(fixture_models["target"], BASE, cpu_subprocess_env,
                           tmp_path_factory.mktemp("matrix_hybrid") / "plain.log")


@pytest.fixture(scope="module", params=list(CONFIGS))
def hybrid(request, plain, fixture_models, cpu_subprocess_env, tmp_path_factory):
    name = request.param
    log = tmp_path_factory.mktemp("matrix_hybrid") / f"{name}.log"
    args = cpu_server_args(**BASE) + [
        "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", fixture_models["noisy"],
        "--speculative-lookahead-hybrid", "--enable-metrics", "--log-level", "info", *CONFIGS[name]]
    srv = _start(fixture_models["target"], args, cpu_subprocess_env, log)
    try:
        results = fm.run_matrix(srv.url, plain["cases"], fixture_models["target"])
        metrics = fm.get(srv.url + "/metrics")
        info = fm.get(srv.url + "/get_server_info")
        log_text = srv.log_tail(200_000)
    finally:
        srv.stop()
    return {"name": name, "results": results, "metrics": metrics, "info": info, "log": log_text}


@pytest.mark.parametrize("case", COMPARED)
def test_identical_to_plain_decoding(plain, hybrid, case):
    diffs = fm.differences(plain["results"][case], hybrid["results"][case], f"{hybrid['name']}:{case}")
    assert not diffs, "\n".join(diffs[:10])


def test_structured_output_is_valid(plain):
    import json
    import re

    res = plain["results"]
    assert all(re.fullmatch(fm.REGEX, a["text"]) for a in res["regex"])
    assert set(json.loads(res["json_schema"][0]["text"])) == {"name", "count", "tags"}
    assert set(json.loads(res["openai_response_format"])) == {"name", "count", "tags"}


def test_both_drafters_ran_and_metrics_are_exported(hybrid):
    import json

    from test_e2e_server import _metric

    m = hybrid["metrics"]
    assert _metric(m, "sglang:lookahead_hybrid_request_steps_total", source="eagle") > 0
    assert _metric(m, "sglang:lookahead_hybrid_request_steps_total", source="trie") > 0
    assert _metric(m, "sglang:lookahead_hybrid_eagle_steps_total", action="drafted") > 0
    assert _metric(m, "sglang:lookahead_hybrid_accept_length_count") > 0
    assert _metric(m, "sglang:lookahead_hybrid_trie_draft_seconds_count") > 0
    state = json.loads(hybrid["info"])["internal_states"][0]
    assert state["speculative_algorithm"] == "EAGLE"
    stats = state["lookahead_hybrid"]
    assert sum(stats["request_steps"].values()) == _metric(m, "sglang:lookahead_hybrid_request_steps_total")


def test_no_server_error(hybrid):
    assert "Traceback" not in hybrid["log"], hybrid["log"][-6000:]
    assert "Grammar accept_token failed" not in hybrid["log"]


def test_sampled_grammar_request_follows_the_grammar(hybrid):
    assert hybrid["results"]["regex_sampled_valid"]


def test_stream_and_abort(plain, hybrid):
    res = hybrid["results"]["stream"]
    assert res["chunks"] > 1 and res["prefixes"] and res["text"] == res["whole"]
    abort = hybrid["results"]["abort"]
    assert abort["healthy"] and abort["chunks"] >= 3
    assert not fm.differences(plain["results"]["abort"]["after"], abort["after"])
