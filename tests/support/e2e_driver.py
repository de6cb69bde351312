"""Runs ``sgl.Engine`` configurations one after the other and writes their
outputs as JSON: the driver behind the end-to-end engine tests.

It must run in a process prepared for sglang's CPU engine (``cpu_env()``
before sglang is imported), so the tests start it as a subprocess:
``python tests/support/e2e_driver.py SPEC.json OUT.json``.  SPEC holds the model
path, the prompts, and a list of runs: engine keyword arguments, the
sampling parameters, and the prompt groups to submit as one ``generate``
call each (a group of n prompts is decoded as a batch of n). Prompts are
texts or token-id lists; ``"server_info": [keys]`` records those keys of the
scheduler's internal state after each group; ``"top_logprobs": k`` records
each output token's ``k`` most likely tokens (what ``lookahead/validate/numerics.py``
reads near ties from); ``"overlap_on_cpu": true``
starts the engine with overlap scheduling (see ``_overlap_on_cpu``);
``"calls": {"i": [name, ...]}`` makes the engine calls named (``_CALLS``)
after group ``i``, before its server info is recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_driver(spec: dict, tmp: Path, env: dict, driver: str = "e2e_driver.py", timeout: int = 1800) -> dict:
    """Write ``spec`` into ``tmp``, run ``tests/<driver>`` on it in a subprocess
    with ``env``, and return the JSON it wrote; a failure shows the driver's output."""
    import subprocess

    (tmp / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / driver), str(tmp / "spec.json"), str(tmp / "out.json")],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, f"driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads((tmp / "out.json").read_text())


def _prose() -> str:
    import textwrap

    return textwrap.dedent(textwrap.__doc__ or "") * 2


def prompts() -> list[str]:
    """Twenty-four prompts: repetitive and not, short and long, copy-heavy."""
    import inspect
    import json as json_mod
    import textwrap

    code = inspect.getsource(textwrap.TextWrapper._split)
    doc = inspect.getsource(json_mod.dumps)[:1200]
    out = [
        "def add(a, b):\n    return",
        "import os\nimport sys\nimport os\nimport sys\nimport os\nimport sys\n",
        "the cat the cat the cat the cat the cat",
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
        "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,",
        "Hello world. Hello world. Hello",
        "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(",
        "SELECT name FROM users WHERE id = 1;\nSELECT name FROM users WHERE id =",
        "a",
        "The quick brown fox jumps over the lazy dog.",
        "Rewrite this function with type hints:\n" + code,
        "Question about this document:\n" + doc + "\nWhat does it return?",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\ndef fib2(n):\n",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
        "<html><body><div><div><div>",
        "while True:\n    pass\nwhile True:\n",
        "Copy the text exactly:\n" + _prose()[:800],
        "if x:\n    y = 1\nelif z:\n    y = 2\nelse:\n",
        "return self.value",
        "# TODO: fix\n# TODO: fix\n# TODO:",
        "key: value\nkey: value\nkey:",
        "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n",
        "zzz",
        "assert foo(1) == 2\nassert foo(2) == 3\nassert foo(3) ==",
    ]
    return out


@contextlib.contextmanager
def _overlap_on_cpu(lift: bool):
    """With ``lift``, the engine resolves its arguments with the CPU guards of
    overlap scheduling lifted (SGLang's for EAGLE, LOOKAHEAD's own): on CPU,
    torch streams are stubs, so an overlapped engine runs its forwards in
    order and processes each result one step late, which is the relay and
    bookkeeping logic of the GPU path. EAGLE's overlap relay also needs
    ``LOOKAHEAD_CPU_TORCH_SPEC_GATHER=1`` in the environment (see the CPU
    ``sgl_kernel``'s ``sitecustomize``)."""
    if not lift:
        yield
        return
    import sglang.srt.arg_groups.speculative_hook as hook

    import lookahead.plugin.arg_rules as lookahead_args

    saved = hook._disable_overlap_schedule_for_cpu, lookahead_args.disable_overlap_on_cpu
    hook._disable_overlap_schedule_for_cpu = lookahead_args.disable_overlap_on_cpu = lambda server_args: None
    try:
        yield
    finally:
        hook._disable_overlap_schedule_for_cpu, lookahead_args.disable_overlap_on_cpu = saved


def _update_one_matrix(engine, model: str) -> None:
    """A small real change to one weight matrix, as a training step makes."""
    import torch
    from safetensors.torch import load_file

    name = "model.layers.0.mlp.down_proj.weight"
    weight = load_file(str(next(Path(model).glob("*.safetensors"))))[name].float()
    engine.begin_weight_update()  # SGLang 0.5.23: tensor updates run inside a session
    ok, message = engine.update_weights_from_tensor([(name, weight * (1 + 0.01 * torch.randn(weight.shape)))],
                                                    flush_cache=False)[:2]
    engine.end_weight_update()
    assert ok, f"update_weights_from_tensor failed: {message}"
    _flush(engine)


def _update_from_distributed(engine, model: str) -> None:
    """The same change sent as a trainer sends it: rank 0 of a process group
    of its own broadcasts the matrix to the engine (gloo here; NCCL on GPUs)."""
    import socket
    import threading

    import torch
    from safetensors.torch import load_file
    from sglang.srt.utils import init_custom_process_group

    name, group = "model.layers.0.mlp.down_proj.weight", "lookahead-trainer"
    weight = load_file(str(next(Path(model).glob("*.safetensors"))))[name]
    weight = (weight.float() * (1 + 0.01 * torch.randn(weight.shape))).to(weight.dtype)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    trainer, failed = {}, []

    def join():  # the trainer's side of the rendezvous, which blocks until the engine joins
        try:
            trainer["pg"] = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}",
                                                      world_size=2, rank=0, group_name=group)
        except Exception as e:  # reported below, in the caller's thread
            failed.append(e)

    t = threading.Thread(target=join)
    t.start()
    _succeeded(engine.init_weights_update_group("127.0.0.1", port, 1, 2, group, backend="gloo"))
    t.join(60)
    assert not failed and "pg" in trainer, f"the trainer's process group did not form: {failed}"
    engine.begin_weight_update()
    send = threading.Thread(target=lambda: torch.distributed.broadcast(weight, src=0, group=trainer["pg"]))
    send.start()
    result = engine.update_weights_from_distributed([name], [str(weight.dtype).split(".")[-1]],
                                                    [list(weight.shape)], group_name=group, flush_cache=False)
    send.join(60)
    engine.end_weight_update()
    _succeeded(result)
    _succeeded(engine.destroy_weights_update_group(group))
    torch.distributed.destroy_process_group(trainer["pg"])
    _flush(engine)


def _flush(engine) -> None:
    """``flush_cache`` once the scheduler is idle: right after a generate call
    returns, its last batch may still be held for one loop iteration, and an
    immediate flush is refused (RL frameworks flush after updating weights)."""
    result = engine.loop.run_until_complete(engine.tokenizer_manager.flush_cache(timeout_s=30))
    assert result.success, result


def _succeeded(result) -> None:
    ok, message = result[:2]
    assert ok, message


def _set_internal_state(engine, **server_args) -> None:
    from sglang.srt.managers.io_struct import SetInternalStateReq

    out = engine.loop.run_until_complete(
        engine.tokenizer_manager.set_internal_state(SetInternalStateReq(server_args=server_args)))
    assert all(out), f"set_internal_state({server_args}) was refused"


# Engine calls a run may make between its groups (RL training loops make them between rollouts).
_CALLS = {
    "flush_cache": lambda engine, model: _flush(engine),
    "update_weights_from_tensor": _update_one_matrix,
    "update_weights_from_distributed": _update_from_distributed,
    "update_weights_from_disk": lambda engine, model: (_flush(engine),  # idle first: it flushes as it ends
                                                       _succeeded(engine.update_weights_from_disk(model))),
    "release_resume": lambda engine, model: (engine.release_memory_occupation(),
                                             engine.resume_memory_occupation()),
    "clear_history": lambda engine, model: _set_internal_state(engine, speculative_lookahead_clear_history=True),
}


def main(spec_path: str, out_path: str) -> None:
    sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools")]
    from cpu_env import apply_cpu_env, cpu_engine_kwargs

    apply_cpu_env()
    import psutil

    import sglang as sgl

    spec = json.loads(Path(spec_path).read_text())
    texts = spec.get("prompts") or prompts()
    result = {"prompts": texts, "runs": {}, "engine_pids": []}
    for run in spec["runs"]:
        kwargs = cpu_engine_kwargs(**run.get("engine", {}))
        started = time.time()
        with _overlap_on_cpu(run.get("overlap_on_cpu", False)):
            engine = sgl.Engine(model_path=spec["model"], log_level=spec.get("log_level", "error"), **kwargs)
        try:
            result["engine_pids"] += [p.pid for p in psutil.Process().children(recursive=True)]
            groups = run.get("groups") or [list(range(len(texts)))]
            outputs, infos, by_group = {}, [], []
            t0 = time.time()
            top = run.get("top_logprobs", 0)
            logprobs = {"return_logprob": True, "top_logprobs_num": top} if top else {}
            for g, group in enumerate(groups):
                batch = [texts[i] for i in group]
                if all(isinstance(p, list) for p in batch):  # token-id prompts
                    outs = engine.generate(input_ids=batch, sampling_params=run["sampling"], **logprobs)
                else:
                    outs = engine.generate(batch, run["sampling"], **logprobs)
                for i, o in zip(group, outs):
                    meta = o["meta_info"]
                    outputs[i] = {
                        "output_ids": o["output_ids"],
                        "spec_verify_ct": meta.get("spec_verify_ct"),
                        "spec_accept_length": meta.get("spec_accept_length"),
                        "completion_tokens": meta.get("completion_tokens"),
                    }
                    if top:
                        outputs[i]["output_top_logprobs"] = meta.get("output_top_logprobs")
                by_group.append({str(i): outputs[i] for i in group})
                for call in run.get("calls", {}).get(str(g), []):
                    _CALLS[call](engine, spec["model"])
                if run.get("server_info"):
                    # What the scheduler reports after each group (e.g. the hybrid's stats).
                    state = engine.get_server_info()["internal_states"][0]
                    infos.append({k: state.get(k) for k in run["server_info"]})
            gen_s = time.time() - t0
            trie_path = run.get("engine", {}).get("speculative_lookahead_path")
            if trie_path:
                # The drained server saves in the background; SGLang stops its
                # schedulers with SIGKILL, so wait for the save to land.
                deadline = time.time() + 30
                while time.time() < deadline and not (os.path.exists(trie_path) and os.path.getmtime(trie_path) >= t0):
                    time.sleep(0.2)
        finally:
            engine.shutdown()
        result["runs"][run["name"]] = {
            "outputs": {str(k): v for k, v in outputs.items()},
            "server_info": infos,
            "group_outputs": by_group,
            "start_s": round(t0 - started, 1),
            "generate_s": round(gen_s, 2),
        }
        print(run["name"], "start", round(t0 - started, 1), "s, generate", round(gen_s, 2), "s", flush=True)
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
