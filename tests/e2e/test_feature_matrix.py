"""Every SGLang feature a user combines with LOOKAHEAD, against plain decoding.

Real ``python -m sglang.launch_server`` processes on CPU (tiny model): a
plain server, then LOOKAHEAD with a tree (width 8), with one branch (width
4, the README's command) and with a tree under overlap scheduling (the CPU
guard lifted for that server only). Each serves the whole matrix of
``feature_matrix.py`` once; the tests compare the answers case by case.

The plain server runs without overlap scheduling: with overlap, plain
decoding counts penalties one token late (its penalizers read ``output_ids``
before the previous step's token is in it), while LOOKAHEAD applies the exact
rule in both of its modes.
"""

from __future__ import annotations

import pytest

from lookahead.validate import feature_matrix as fm
from cpu_env import cpu_server_args
from lookahead.validate.server import SGLangServer

# JSON without free whitespace: the tiny model would otherwise fill its budget with it.
BASE = dict(max_running_requests=16, max_total_tokens=24576, chunked_prefill_size=256,
            enable_custom_logit_processor=True,
            constrained_json_disable_any_whitespace=True)
CONFIGS = {
    "tree": ["--speculative-num-draft-tokens", "8"],
    "chain": ["--speculative-num-draft-tokens", "4", "--speculative-one-branch"],
    "overlap": ["--speculative-num-draft-tokens", "8"],
    "auto": ["--speculative-num-draft-tokens", "8", "--speculative-lookahead-max-batch-size", "auto"],
}


def _start(model, args, env, log, **kwargs) -> SGLangServer:
    srv = SGLangServer(model, args, env, log, **kwargs)
    srv.start(timeout=600)
    return srv


def plain_reference(model, base: dict, env, log) -> dict:
    """The matrix served once by plain decoding, without overlap (see above):
    its cases and their answers, what every configuration is compared with."""
    srv = _start(model, cpu_server_args(**base, disable_overlap_schedule=True), env, log)
    try:
        cases, results = fm.reference(srv.url, model)
    finally:
        srv.stop()
    return {"cases": cases, "results": results}


@pytest.fixture(scope="module")
def plain(tiny_model, cpu_subprocess_env, tmp_path_factory):
    return plain_reference(tiny_model, BASE, cpu_subprocess_env, tmp_path_factory.mktemp("matrix") / "plain.log")


@pytest.fixture(scope="module", params=list(CONFIGS))
def lookahead(request, plain, tiny_model, cpu_subprocess_env, tmp_path_factory):
    name = request.param
    log = tmp_path_factory.mktemp("matrix") / f"{name}.log"
    args = cpu_server_args(**BASE) + ["--speculative-algorithm", "LOOKAHEAD", "--enable-metrics", "--log-level", "info",
                                      *CONFIGS[name]]
    launcher = ("tests/support/overlap_launch.py",) if name == "overlap" else ("-m", "sglang.launch_server")
    srv = _start(tiny_model, args, cpu_subprocess_env, log, launcher=launcher)
    try:
        results = fm.run_matrix(srv.url, plain["cases"], tiny_model)
        metrics = fm.get(srv.url + "/metrics")
        log_text = srv.log_tail(200_000)
    finally:
        srv.stop()
    return {"name": name, "results": results, "metrics": metrics, "log": log_text}


def assert_same(expected, got, where="answer"):
    diffs = fm.differences(expected, got, where)
    assert not diffs, "\n".join(diffs[:10])


@pytest.mark.parametrize("case", fm.COMPARED)
def test_identical_to_plain_decoding(plain, lookahead, case):
    assert_same(plain["results"][case], lookahead["results"][case], f"{lookahead['name']}:{case}")


def test_cases_exercise_what_they_name(plain):
    res = plain["results"]
    import json
    import re

    assert all(re.fullmatch(fm.REGEX, a["text"]) for a in res["regex"])
    assert res["regex_sampled_valid"]
    parsed = json.loads(res["json_schema"][0]["text"])
    assert set(parsed) == {"name", "count", "tags"}
    assert re.fullmatch(r"SELECT [a-z]{1,6} FROM [a-z]{1,6};", res["ebnf"][0]["text"])
    assert set(json.loads(res["openai_response_format"])) == {"name", "count", "tags"}
    # The stop token is hit in the middle of the output, not at its end.
    stop = res["stop_token_ids"][0]
    assert stop["finish_reason"]["type"] == "stop" and stop["completion_tokens"] < 48
    # min_new_tokens holds the early stop token back.
    assert res["min_new_tokens"][0]["completion_tokens"] >= 12
    assert [len(a["output_ids"]) for a in res["max_new_tokens_1"] + res["max_new_tokens_2"]] == [1, 2]
    assert len(res["n_2"]) == 2
    assert len(res["logprobs_bs6"]) == 6 and all(len(a["output_top_logprobs"]) == 40 for a in res["logprobs_bs6"])
    assert res["logprobs_start_len"][0]["input_token_logprobs"]
    (stop_str,) = plain["cases"]["stop_string"][0]["sampling_params"]["stop"]
    (answer,) = res["stop_string"]
    assert stop_str and stop_str not in answer["text"] and answer["finish_reason"]["type"] == "stop"
    regex = plain["cases"]["stop_regex"][0]["sampling_params"]["stop_regex"]
    (answer,) = res["stop_regex"]
    assert answer["finish_reason"] == {"type": "stop", "matched": regex} and answer["completion_tokens"] < 40
    assert all(len(a["output_token_ids_logprobs"]) == 40 for a in res["token_ids_logprob"])
    assert len(res["concurrent_16"]) == 16
    # Each penalty changes the output (else its case would prove nothing).
    for case in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
        assert [a["output_ids"] for a in res[case]] != [a["output_ids"] for a in res["greedy"]], case
    # The processor changed the output: the forbidden token is gone.
    forbidden = res["custom_logit_processor"][0]["output_ids"]
    assert forbidden != res["greedy"][0]["output_ids"][: len(forbidden)]
    assert plain["cases"]["custom_logit_processor"][0]["sampling_params"]["custom_params"]["token_ids"][0] not in forbidden


def test_speculation_ran_on_the_intended_paths(lookahead):
    from test_e2e_server import _metric

    m = lookahead["metrics"]
    steps = lambda **labels: _metric(m, "sglang:lookahead_steps_total", **labels)  # noqa: E731
    assert steps() > 0
    # Nothing runs on graphs on CPU.
    for path in ("verify-graph", "single-graph"):
        assert steps(path=path) == 0
    # A batch with a custom logit processor verified one token per request.
    assert steps(reason="custom_logit_processor") > 0
    assert steps(path="verify-eager", reason="custom_logit_processor") == 0
    if lookahead["name"] == "auto":
        # Decided per step: it speculated where that paid, and measured both options.
        assert steps(path="verify-eager", reason="pays") > 0
        assert steps(reason="explore") > 0
        for reason in ("does_not_pay", "too_large", "no_draft"):
            assert steps(path="verify-eager", reason=reason) == 0
    else:
        assert steps(path="verify-eager", reason="verify") > 0
        # The 16 concurrent requests pushed the batch above the max batch size,
        # where every step verified the root alone.
        assert steps(reason="fallback") > 0
        assert steps(path="verify-eager", reason="fallback") == 0
    assert _metric(m, "sglang:lookahead_accept_length_sum") > _metric(m, "sglang:lookahead_accept_length_count")
    waits = lambda **labels: _metric(m, "sglang:lookahead_overlap_waits_total", **labels)  # noqa: E731
    if lookahead["name"] == "overlap":
        # A drafting step reads the previous step's tokens back (NGRAM's splice);
        # a step that drafts nothing takes its roots on the device and reads
        # nothing back.
        assert waits(reason="verify") > 0
        assert steps(reason="fallback") > 0 and waits(reason="fallback") == 0
        assert waits(reason="custom_logit_processor") == 0
    else:
        assert waits() == 0  # nothing is read late without overlap


def test_no_server_error(lookahead):
    assert "Traceback" not in lookahead["log"], lookahead["log"][-6000:]
    assert "Grammar accept_token failed" not in lookahead["log"]


def test_sampled_grammar_request_follows_the_grammar(lookahead):
    assert lookahead["results"]["regex_sampled_valid"]


def test_long_prompt_is_served_from_the_radix_cache(lookahead):
    assert lookahead["results"]["radix_cache_hit"]
    first, again = lookahead["results"]["long_prompt"]
    assert first["output_ids"] == again["output_ids"]


def test_stream_reassembles_to_the_whole_answer(lookahead):
    res = lookahead["results"]["stream"]
    assert res["chunks"] > 1 and res["prefixes"]
    assert res["text"] == res["whole"]
    assert res["streamed_ids"] == res["output_ids"]


def test_abort_mid_stream_keeps_serving(plain, lookahead):
    res = lookahead["results"]["abort"]
    assert res["chunks"] >= 3
    assert res["healthy"]
    assert res["completion_tokens"] is None or res["completion_tokens"] < 3000
    assert_same(plain["results"]["abort"]["after"], res["after"], "after abort")


def test_overlap_only_where_lifted(lookahead):
    mode = "on" if lookahead["name"] == "overlap" else "off"
    assert f"overlap {mode}" in lookahead["log"]
