"""End to end on real sglang (CPU engine): NGRAM decoding equals plain decoding.

Greedy speculative decoding must not change a single token. The test runs, in
a subprocess set up by ``cpu_env()``, one ``sgl.Engine`` for plain decoding and
then one with ``speculative_algorithm="NGRAM"`` on the tiny model, each shut
down before the next starts, and compares token ids. It also checks that the
speculative path really ran (verify steps, accepted drafts) and that no engine
process outlives the driver.

Runs in about 1-2 minutes on a quiet 2-core machine (sglang start-up dominates).
This file is also the driver: ``python tests/e2e/test_cpu_sglang_smoke.py MODEL OUT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROMPTS = [
    "def add(a, b):\n    return",
    "import os\nimport sys\nimport os\nimport sys\nimport os\nimport sys\n",
    "the cat the cat the cat the cat the cat",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
]
SAMPLING = {"temperature": 0.0, "max_new_tokens": 48, "ignore_eos": True}
ENGINE_OVERRIDES = {"max_total_tokens": 4096, "max_running_requests": 4}
NGRAM = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4}


def test_cpu_server_args_overrides():
    from cpu_env import CPU_SERVER_ARGS, cpu_engine_kwargs, cpu_server_args

    args = cpu_server_args(max_total_tokens=1024, sleep_on_idle=False, enable_metrics=True)
    assert args[args.index("--max-total-tokens") + 1] == "1024"
    assert "--sleep-on-idle" not in args and args[-1] == "--enable-metrics"
    assert args[args.index("--device") + 1] == "cpu" and "--disable-cuda-graph" in args
    assert cpu_server_args() == CPU_SERVER_ARGS
    # 0 is a value, not "leave the flag out" (0 == False in Python).
    zero = cpu_server_args(priority_scheduling_preemption_threshold=0)
    assert zero[zero.index("--priority-scheduling-preemption-threshold") + 1] == "0"
    kwargs = cpu_engine_kwargs(speculative_algorithm="NGRAM")
    assert kwargs["attention_backend"] == "intel_amx" and kwargs["speculative_algorithm"] == "NGRAM"


def test_cpu_env_requires_the_pinned_sglang(monkeypatch):
    import importlib.metadata

    import pytest

    import cpu_env as mod

    mod.check_sglang_version()  # the installed release passes
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.24")
    with pytest.raises(RuntimeError, match=r"sglang 0\.5\.24 is installed; install sglang==0\.5\.23"):
        mod.cpu_env()


def test_apply_cpu_env_twice_in_one_process():
    """A script that runs two benchmarks in one process (the demo: the greedy
    table, then its sampled line) sets the CPU environment up twice, the
    second time with sglang imported: it gets the same environment back. A
    first call after sglang's import still refuses (the CPU path is chosen
    at import time)."""
    code = (
        "import sys; sys.path[:0] = [%r]\n"
        "from cpu_env import apply_cpu_env\n"
        "env = apply_cpu_env()\n"
        "import sglang.srt.utils.common\n"
        "assert apply_cpu_env() == env\n"
        "print('same')\n"
    ) % str(REPO / "cpu")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("same"), proc.stderr[-2000:]
    late = ("import sys; sys.path[:0] = [%r]\nimport sglang.srt.utils.common\n"
            "from cpu_env import apply_cpu_env\napply_cpu_env()\n") % str(REPO / "cpu")
    proc = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "must run before sglang is imported" in proc.stderr


def test_cpu_env_selects_the_amx_path():
    """A process started with ``cpu_env()`` imports the shim and, thanks to the
    shim's sitecustomize hook, sees AMX support (so ``intel_amx`` is kept)."""
    from cpu_env import cpu_env, cpu_sgl_kernel_path

    env = cpu_env(base_env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [cpu_sgl_kernel_path(), "/elsewhere"]
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    code = (
        "import sgl_kernel, sglang.srt.utils.common as c;"
        "print('RESULT', sgl_kernel.IS_CPU_SHIM, c.cpu_has_amx_support())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=cpu_env(), capture_output=True, text=True, timeout=600
    )
    assert "RESULT True True" in proc.stdout, proc.stderr[-4000:]


def test_ngram_matches_plain_decoding(tmp_path):
    import psutil
    import pytest

    from cpu_env import cpu_env, default_cache_dir
    from tiny_model import build_tiny_model

    if not sys.platform.startswith("linux"):
        pytest.skip("the CPU engine is exercised on Linux only")
    model = build_tiny_model(default_cache_dir() / "tiny-llama-seed0", seed=0)
    out = tmp_path / "result.json"
    env = cpu_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO)])
    proc = subprocess.run(
        [sys.executable, __file__, model, str(out)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"driver failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    result = json.loads(out.read_text())

    plain, spec = result["plain"]["outputs"], result["ngram"]["outputs"]
    for p, s in zip(plain, spec):
        assert s["output_ids"] == p["output_ids"], (p["text"], s["text"])
        assert len(p["output_ids"]) == SAMPLING["max_new_tokens"]
    verify_cts = [s["spec_verify_ct"] for s in spec]
    accept_lens = [s["spec_accept_length"] for s in spec]
    assert all(ct and ct > 0 for ct in verify_cts), verify_cts
    assert max(accept_lens) > 1.0, accept_lens  # some drafts were accepted
    assert all(p["spec_verify_ct"] in (None, 0) for p in plain)

    time.sleep(1)
    alive = [pid for pid in result["engine_pids"] if psutil.pid_exists(pid)]
    alive = [pid for pid in alive if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"engine processes left running: {alive}"


def _drive(model: str, out: str) -> None:
    """Run plain then NGRAM engines one after the other; write a JSON summary."""
    import psutil

    import sglang as sgl
    from cpu_env import cpu_engine_kwargs

    summary = {"engine_pids": []}
    for name, extra in (("plain", {}), ("ngram", NGRAM)):
        kwargs = cpu_engine_kwargs(**ENGINE_OVERRIDES, **extra)
        started = time.time()
        engine = sgl.Engine(model_path=model, log_level="error", **kwargs)
        try:
            summary["engine_pids"] += [p.pid for p in psutil.Process().children(recursive=True)]
            t0 = time.time()
            outputs = engine.generate(PROMPTS, SAMPLING)
            gen_s = time.time() - t0
        finally:
            engine.shutdown()
        summary[name] = {
            "start_s": round(t0 - started, 1),
            "generate_s": round(gen_s, 2),
            "outputs": [
                {
                    "text": o["text"],
                    "output_ids": o["output_ids"],
                    "spec_verify_ct": o["meta_info"].get("spec_verify_ct"),
                    "spec_accept_length": o["meta_info"].get("spec_accept_length"),
                }
                for o in outputs
            ],
        }
        print(name, {k: v for k, v in summary[name].items() if k != "outputs"}, flush=True)
    Path(out).write_text(json.dumps(summary))


if __name__ == "__main__":
    _drive(sys.argv[1], sys.argv[2])
