"""``lookahead/validate/__main__.py``, the user's validation script for a CUDA machine,
run end to end on the CPU engine, so that its plumbing (the dataset, the
servers, the feature matrix against the plain reference, bench_serving and
the path counters, the report) cannot rot unseen between GPU runs: it once
failed at its first line on the only GPU it met. What only a GPU proves is
in ``python -m lookahead.validate``; this checks the module that proves it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cpu_env import cpu_env, cpu_server_args

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_its_lookahead_configuration_on_cpu(tiny_model, tmp_path):
    out = tmp_path / "gpu_check"
    proc = subprocess.run(
        [sys.executable, "-m", "lookahead.validate", "--model-path", tiny_model,
         "--num-draft-tokens", "8", "--configs", "lookahead", "--concurrency", "1",
         "--prompts-per-concurrency", "1", "--output-len", "16", "--server-timeout", "300",
         "--extra-server-args", " ".join(cpu_server_args()), "--out-dir", str(out),
         # The comparison a 16-bit model gets on a GPU: the reference also
         # returns its top logprobs, kept apart from the answers compared.
         "--numerics", "near-tie"],
        env=cpu_env(), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "comparing answers up to near ties" in proc.stdout
    assert "PASSED: every answer identical to plain decoding, every step" in proc.stdout
    report = json.loads((out / "gpu_check.json").read_text())
    # In float32 nothing parts, and logprobs stay at float32's distance.
    assert report["failures"] == [] and report["near_ties"] == []
    deviation = [line for line in proc.stdout.splitlines() if "largest logprob deviation" in line]
    assert deviation and float(deviation[0].split()[-2]) < 1e-3, deviation
    (row,) = report["bench"]
    assert row["config"] == "lookahead" and row["concurrency"] == 1 and row["median_tpot_ms"] > 0
    assert row["steps"].get("verify-eager/verify", 0) > 0, row["steps"]  # LOOKAHEAD's steps were read
    # The run's own accept length, from the server's token and verify-call counters: at
    # least the bonus token per verify, at most the verify width of 8.
    assert row["accept_length"] is not None and 1.0 <= row["accept_length"] <= 8.0, row
    compared = [line for line in proc.stdout.splitlines() if line.split()[1:2] == ["lookahead"]]
    assert sum("identical" in line for line in compared) >= 20, compared
    assert row["overlap_waits"] == {}, row  # no overlap scheduling on CPU: nothing is read late


def test_report_fails_a_step_that_drafted_nothing_but_waited(tmp_path, capsys):
    """On a GPU (overlap on) a fallback step takes its roots on the device; one
    that read the previous step's tokens back is on a path the design does
    not intend, and the report says so."""
    import lookahead.validate.__main__ as gpu_check

    row = {"config": "lookahead", "concurrency": 16, "median_tpot_ms": 10.0, "output_throughput": 100.0,
           "accept_length": 1.2, "steps": {"single-graph/fallback": 90, "verify-graph/verify": 10}}
    drafted = {**row, "overlap_waits": {"verify": 10}}
    assert gpu_check.report([drafted], [], tmp_path) == 0
    waited = {**row, "overlap_waits": {"verify": 10, "fallback": 3}}
    assert gpu_check.report([waited], [], tmp_path) == 1
    assert "steps that drafted nothing waited for the previous forward" in capsys.readouterr().out
