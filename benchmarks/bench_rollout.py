"""RL rollouts on a real LLM: GRPO-style groups of samples, several training
steps of the same prompts, a small real weight update between steps.

Each decoding (plain, SGLang's NGRAM, LOOKAHEAD with its default cut-off and
with ``auto``) runs in an ``sgl.Engine`` of its own, as a rollout worker does
(verl drives ``sgl.Engine``):

* a step sends every prompt ``--group`` times at once (the same prompt sent
  n times, as verl sends it) at ``--temperature``, and waits for all of them;
* ``LOOKAHEAD-fixed`` speculates at every batch size at the full width, as
  NGRAM does: its AL is the drafting-only comparison;
* between steps, ``update_weights_from_tensor`` changes one MLP matrix by a
  small random amount (a real change of the policy, as a training step
  makes), which also flushes SGLang's cache.

A step is timed from submission to its last answer, so the tail (the last
samples decoding at small batch sizes) is in it; it is split at the moment
three quarters of the samples had finished. The decodings run in rotated
order in every round (``--rounds``); ratios are per round, then the median
and range over rounds.

    python benchmarks/bench_rollout.py [--temperature 1.0] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

import math_problems  # noqa: E402
from bench_workloads import rate as _rate, stderr_to  # noqa: E402

# The matrix a "training step" changes, and by how much (relative, per element).
UPDATED = "model.layers.0.mlp.down_proj.weight"
UPDATE_SCALE = 0.01
TAIL_AFTER = 0.75  # the tail starts once this share of a step's samples has finished


def configs(width: int, batch: int) -> dict:
    """Each decoding's engine keywords; ``batch`` is the most requests a step runs at once."""
    spec = {"speculative_num_draft_tokens": width}
    return {
        "plain": {},
        "NGRAM": {**spec, "speculative_algorithm": "NGRAM"},
        "LOOKAHEAD": {**spec, "speculative_algorithm": "LOOKAHEAD"},
        "LOOKAHEAD-auto": {**spec, "speculative_algorithm": "LOOKAHEAD",
                           "speculative_lookahead_max_batch_size": "auto"},
        # Speculating at every batch size the run reaches (the cut-off is the
        # full batch) and verifying at the full width, as NGRAM does: the
        # drafting-only comparison (AL), and how AL grows with the history
        # when no cut-off hides it.
        "LOOKAHEAD-fixed": {**spec, "speculative_algorithm": "LOOKAHEAD", "speculative_lookahead_fixed_width": True,
                            "speculative_lookahead_max_batch_size": batch},
    }


def updated_weight(model: str, step: int):
    """``UPDATED`` after ``step`` small random training steps (the same for every decoding)."""
    import torch
    from safetensors.torch import load_file

    weights = {}
    for f in sorted(Path(model).glob("*.safetensors")):
        weights.update(load_file(str(f)))
    w = weights[UPDATED].float()
    g = torch.Generator().manual_seed(step)
    for _ in range(step):
        w = w * (1 + UPDATE_SCALE * torch.randn(w.shape, generator=g))
    return w


def rollout_step(engine, prompts: list[str], group: int, sampling: dict) -> dict:
    batch = [p for p in prompts for _ in range(group)]
    t0 = time.perf_counter()
    outs = engine.generate(batch, sampling)
    seconds = time.perf_counter() - t0
    latencies = sorted(o["meta_info"].get("e2e_latency") or seconds for o in outs)
    split = latencies[max(0, int(TAIL_AFTER * len(latencies)) - 1)]
    tokens = sum(len(o["output_ids"]) for o in outs)
    # Steps as docs/benchmarks.md counts them for every decoding: the prefill
    # (which gives the first token), then each decode or verify step.
    steps = sum(1 + o["meta_info"]["spec_verify_ct"] if o["meta_info"].get("spec_verify_ct")
                else len(o["output_ids"]) for o in outs)
    return {"tokens": tokens, "seconds": seconds, "steps": steps, "full_batch_s": min(split, seconds),
            "tail_s": max(0.0, seconds - split), "outputs": [o["output_ids"] for o in outs]}


def serve(model: str, kwargs: dict, prompts: list[str], args, log: Path) -> list[dict]:
    import sglang as sgl

    sampling = {"temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens}
    with stderr_to(log):
        engine = sgl.Engine(model_path=model, log_level="error", **kwargs)
    try:
        engine.generate("Say hello.", {**sampling, "max_new_tokens": 8})  # first-call costs, not measured
        steps = []
        for step in range(1, args.steps + 1):
            steps.append(rollout_step(engine, prompts, args.group, sampling))
            if step < args.steps:
                engine.begin_weight_update()  # SGLang 0.5.23: tensor updates run inside a session
                ok, message = engine.update_weights_from_tensor([(UPDATED, updated_weight(model, step))],
                                                                flush_cache=False)[:2]
                engine.end_weight_update()
                # Flushed once the scheduler is idle (right after a generate call
                # its last batch may still be held, and an immediate flush is refused).
                flushed = engine.loop.run_until_complete(engine.tokenizer_manager.flush_cache(timeout_s=30))
                if not ok or not flushed.success:
                    raise RuntimeError(f"update_weights_from_tensor failed: {message}; flush: {flushed}")
        return steps
    finally:
        with stderr_to(log):
            engine.shutdown()


def _al(s: dict) -> float:
    return s["tokens"] / s["steps"]


def _total(steps: list[dict]) -> dict:
    return {k: sum(s[k] for s in steps) for k in ("tokens", "seconds", "steps", "full_batch_s", "tail_s")}


def _spread(values: list[float]) -> str:
    return f"**{statistics.median(values):.2f}** [{min(values):.2f}-{max(values):.2f}]"


def report(rounds: list[dict], names: list[str]) -> dict:
    """Per step and over the whole rollout: tokens/s against plain and NGRAM,
    AL, and the time in the full batch and in the tail, as medians [ranges] over rounds."""
    n_steps = len(rounds[0][names[0]])
    rows = [(f"step {i + 1}", lambda r, n, i=i: r[n][i]) for i in range(n_steps)]
    rows.append(("all", lambda r, n: _total(r[n])))
    summary = {}
    print("| steps | decoding | tokens/s vs plain | vs NGRAM | AL | tokens/s | full batch s | tail s |")
    print("|---|---|---|---|---|---|---|---|")
    for label, pick in rows:
        for name in names:
            figs = [pick(r, name) for r in rounds]
            vs_plain = [_rate(pick(r, name)) / _rate(pick(r, "plain")) for r in rounds] if "plain" in names else []
            vs_ngram = [_rate(pick(r, name)) / _rate(pick(r, "NGRAM")) for r in rounds] if "NGRAM" in names else []
            als = [_al(f) for f in figs]
            summary.setdefault(label, {})[name] = {"vs_plain": vs_plain, "vs_ngram": vs_ngram, "al": als,
                                                   "tokens_per_s": [_rate(f) for f in figs]}
            print(f"| {label} | {name} | {_spread(vs_plain) if vs_plain else '-'} | "
                  f"{_spread(vs_ngram) if vs_ngram else '-'} | {_spread(als)} | "
                  f"{statistics.median(_rate(f) for f in figs):.1f} | "
                  f"{statistics.median(f['full_batch_s'] for f in figs):.1f} | "
                  f"{statistics.median(f['tail_s'] for f in figs):.1f} |")
    for name in names:
        if name != "plain" and n_steps > 1:
            growth = [_al(r[name][-1]) / _al(r[name][0]) for r in rounds]
            summary.setdefault("al_last_over_first", {})[name] = growth
            print(f"{name}: AL at step {n_steps} over step 1: {_spread(growth)}")
    return summary


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct, fetched on first use")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--prompts", type=int, default=2, help="distinct prompts per step")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO's group size)")
    ap.add_argument("--steps", type=int, default=3, help="training steps: rollouts of the same prompts")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="verify width (root included)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the decodings' order rotated in each")
    ap.add_argument("--set", default="report", choices=tuple(math_problems.SETS), help="which problems")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="plain,NGRAM,LOOKAHEAD,LOOKAHEAD-auto,LOOKAHEAD-fixed")
    ap.add_argument("--log", default=None, help="where SGLang's messages go (default: .cache/bench_rollout_sglang.log)")
    ap.add_argument("--json", default=None, help="write every round's figures here")
    return ap.parse_args(argv)


def run(args) -> dict:
    from cpu_env import apply_cpu_env, cpu_engine_kwargs, default_cache_dir

    apply_cpu_env()
    from transformers import AutoTokenizer

    from real_model import real_model_path

    model = args.model_path or real_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model)
    log = Path(args.log) if args.log else default_cache_dir() / "bench_rollout_sglang.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": math_problems.instruction(p)}],
                                             tokenize=False, add_generation_prompt=True)
               for p in math_problems.problems(args.prompts, args.set, args.seed)]
    batch = args.prompts * args.group
    base = cpu_engine_kwargs(dtype=args.dtype, max_running_requests=batch,
                             max_total_tokens=max(16384, batch * (args.max_new_tokens + 256)))
    table = configs(args.num_draft_tokens, batch)
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in table]
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown}; choose from {', '.join(table)}")
    print(f"model: {model} ({args.dtype}); {args.prompts} prompts x groups of {args.group} at temperature "
          f"{args.temperature} (top-p {args.top_p}), {args.steps} steps, at most {args.max_new_tokens} new tokens, "
          f"verify width {args.num_draft_tokens}; {args.rounds} rounds, order rotated; {args.set} set", flush=True)
    rounds = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        figures = {}
        for name in order:
            t0 = time.time()
            print(f"  round {r + 1}: {name}...", end="", flush=True)
            figures[name] = serve(model, {**base, **table[name]}, prompts, args, log)
            print(f" {time.time() - t0:.0f} s", flush=True)
        rounds.append({n: figures[n] for n in names})
    print()
    summary = report(rounds, names)
    # The outputs stay in: the replay reads them as a trace of sampled rollouts.
    out = {"model": model, "args": vars(args), "summary": summary, "prompts": prompts, "rounds": rounds}
    if args.json:
        Path(args.json).write_text(json.dumps(out, separators=(",", ":")))  # compact: it holds every output
    return out


if __name__ == "__main__":
    run(parse())
