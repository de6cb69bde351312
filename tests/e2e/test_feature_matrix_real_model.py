"""The feature matrix on the real model: every SGLang feature a user combines
with LOOKAHEAD, against plain decoding, on SmolLM2-135M-Instruct.

The tiny random model (``test_feature_matrix.py``) runs every configuration
cheaply; a real LLM is the ground truth that its drafts and near ties are not
an artefact of random weights. float32, so answers must be identical token
for token (logprobs within float32's distance); a LOOKAHEAD tree at width 8.
One plain server and one LOOKAHEAD server, each serving the whole matrix once.
"""

from __future__ import annotations

import pytest

from cpu_env import cpu_server_args
from lookahead.validate import feature_matrix as fm
from test_feature_matrix import _start, plain_reference

BASE = dict(max_running_requests=16, max_total_tokens=24576, chunked_prefill_size=256,
            enable_custom_logit_processor=True, dtype="float32")


@pytest.fixture(scope="module")
def plain(real_model, cpu_subprocess_env, tmp_path_factory):
    return plain_reference(real_model, BASE, cpu_subprocess_env, tmp_path_factory.mktemp("matrix_real") / "plain.log")


@pytest.fixture(scope="module")
def lookahead(plain, real_model, cpu_subprocess_env, tmp_path_factory):
    log = tmp_path_factory.mktemp("matrix_real") / "tree.log"
    args = cpu_server_args(**BASE) + ["--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", "8",
                                      "--enable-metrics", "--log-level", "info"]
    srv = _start(real_model, args, cpu_subprocess_env, log)
    try:
        results = fm.run_matrix(srv.url, plain["cases"], real_model)
        metrics = fm.get(srv.url + "/metrics")
        log_text = srv.log_tail(200_000)
    finally:
        srv.stop()
    return {"results": results, "metrics": metrics, "log": log_text}


@pytest.mark.parametrize("case", fm.COMPARED)
def test_identical_to_plain_decoding_on_the_real_model(plain, lookahead, case):
    diffs = fm.differences(plain["results"][case], lookahead["results"][case], f"real:{case}")
    assert not diffs, "\n".join(diffs[:10])


def test_the_real_model_speculated_and_served_without_error(lookahead):
    from test_e2e_server import _metric

    m = lookahead["metrics"]
    assert _metric(m, "sglang:lookahead_steps_total", path="verify-eager", reason="verify") > 0
    # Drafts were accepted: more tokens committed than verify steps.
    assert _metric(m, "sglang:lookahead_accept_length_sum") > _metric(m, "sglang:lookahead_accept_length_count")
    assert "Traceback" not in lookahead["log"], lookahead["log"][-6000:]
    assert lookahead["results"]["regex_sampled_valid"]
    first, again = lookahead["results"]["long_prompt"]
    assert first["output_ids"] == again["output_ids"]
