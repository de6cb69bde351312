"""What LOOKAHEAD's CPU sampling path costs a step that does not speculate.

A width-1 step (no drafts: above the cut-off, or where ``auto`` judged
speculation not paying) still goes through the verify flow's sampler,
``lookahead.plugin.cpu_sampling.tree_sampling_verify``. Plain decoding samples
with ``Sampler.forward``'s standard path: divide by the temperature, softmax,
``sampling_from_probs_torch`` (or the top-k/top-p/min-p sampler when a filter
is on). This times both on the same logits (the model's vocabulary, random
logits, seeded and unseeded requests), alternating the two in every round so
drift hits both alike, and sets the difference against a plain decode step of
the real model at the same batch size, measured in an ``sgl.Engine`` in the
same run (49 new tokens less one, over 48 steps, the best of two tries).
It prints the difference of the medians and the range of the rounds' paired
differences. Wider verify steps, end to end, are in ``bench_sampling.py``.

    python benchmarks/bench_sampler.py [--batch 1 4 8] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

from bench_workloads import stderr_to  # noqa: E402


def sampling_info(bs: int, temperature: float, top_p: float, seeded: bool):
    """The ``SamplingBatchInfo`` fields both samplers read."""
    import torch

    top_ps = torch.full((bs,), top_p)
    return types.SimpleNamespace(
        temperatures=torch.full((bs, 1), temperature), top_ks=torch.full((bs,), 1 << 30, dtype=torch.int32),
        top_ps=top_ps, min_ps=torch.zeros(bs), need_top_k_sampling=False,
        need_top_p_sampling=bool((top_ps != 1.0).any()), need_min_p_sampling=False, max_top_k=None,
        sampling_seed=torch.arange(bs, dtype=torch.int64) + 7 if seeded else None, logit_bias=None)


def plain_sample(logits, info, positions):
    """``Sampler.forward``'s standard path in SGLang 0.5.23 (CPU)."""
    from sglang.kernels.ops.sampling import softmax
    from sglang.srt.layers.sampler import sampling_from_probs_torch, top_k_top_p_min_p_sampling_from_probs_torch

    logits.div_(info.temperatures)
    probs = softmax(logits)
    if not (info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling):
        return sampling_from_probs_torch(probs, sampling_seed=info.sampling_seed, positions=positions)
    return top_k_top_p_min_p_sampling_from_probs_torch(probs, info.top_ks, info.top_ps, info.min_ps,
                                                       info.need_min_p_sampling, info.sampling_seed, positions,
                                                       max_top_k=info.max_top_k)


def width1_sample(logits, info, positions):
    """LOOKAHEAD's verify sampler on a width-1 step (each request's root alone)."""
    import torch

    from lookahead.plugin.cpu_sampling import tree_sampling_verify

    bs = logits.shape[0]
    verify = types.SimpleNamespace(draft_token_num=1, custom_mask=None,
                                   draft_token=torch.zeros(bs, dtype=torch.int64),
                                   retrieve_index=torch.arange(bs).view(bs, 1), positions=positions)
    batch = types.SimpleNamespace(sampling_info=info, seq_lens=torch.ones(bs))
    return tree_sampling_verify(verify, batch, types.SimpleNamespace(next_token_logits=logits))[0]


def time_samplers(bs: int, vocab: int, rounds: int, calls: int, **kind) -> dict:
    """Median seconds per call of each sampler, alternating them within every round."""
    import torch

    torch.manual_seed(0)
    base = torch.randn(bs, vocab) * 3
    info = sampling_info(bs, **kind)
    positions = torch.arange(bs, dtype=torch.int64) + 100
    per = {"plain": [], "width1": []}
    fns = {"plain": plain_sample, "width1": width1_sample}
    for fn in fns.values():  # first calls build kernels (the seeded draw compiles one): not timed
        fn(base.clone(), info, positions)
    for r in range(rounds):
        for name in (("plain", "width1") if r % 2 == 0 else ("width1", "plain")):
            copies = [base.clone() for _ in range(calls)]  # both samplers modify the logits in place
            t0 = time.perf_counter()
            for logits in copies:
                fns[name](logits, info, positions)
            per[name].append((time.perf_counter() - t0) / calls)
    return {name: statistics.median(v) for name, v in per.items()} | {"rounds": per}


def decode_step_seconds(model: str, dtype: str, batch_sizes, log: Path) -> dict:
    """A plain decode step of the real model per batch size, in an ``sgl.Engine``."""
    import sglang as sgl
    from cpu_env import cpu_engine_kwargs

    with stderr_to(log):
        engine = sgl.Engine(model_path=model, log_level="error",
                            **cpu_engine_kwargs(dtype=dtype, max_running_requests=max(batch_sizes)))
    try:
        sampling = {"temperature": 1.0, "ignore_eos": True}
        engine.generate("Say hello.", {**sampling, "max_new_tokens": 8})
        out = {}
        for bs in batch_sizes:
            prompts = [f"Write a short story about the number {i}." for i in range(bs)]
            took = {}
            for n in (1, 49, 1, 49):  # a prefill alone, and with 48 decode steps; twice, the best of each
                t0 = time.perf_counter()
                engine.generate(prompts, {**sampling, "max_new_tokens": n})
                took[n] = min(took.get(n, float("inf")), time.perf_counter() - t0)
            out[bs] = (took[49] - took[1]) / 48
        return out
    finally:
        with stderr_to(log):
            engine.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct, fetched on first use")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=5, help="rounds, the samplers' order alternated per round")
    ap.add_argument("--calls", type=int, default=50, help="sampler calls per round and sampler")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from cpu_env import apply_cpu_env, default_cache_dir

    apply_cpu_env()
    from real_model import real_model_path
    from transformers import AutoConfig

    model = args.model_path or real_model_path()
    vocab = AutoConfig.from_pretrained(model).vocab_size
    log = default_cache_dir() / "bench_sampler_sglang.log"
    steps = decode_step_seconds(model, args.dtype, args.batch, log)
    kinds = {"T 1.0": dict(temperature=1.0, top_p=1.0, seeded=False),
             "T 0.7, top-p 0.9": dict(temperature=0.7, top_p=0.9, seeded=False),
             "T 1.0, seeded": dict(temperature=1.0, top_p=1.0, seeded=True)}
    print(f"model: {model} ({args.dtype}), vocabulary {vocab}; {args.rounds} rounds x {args.calls} calls, "
          "order alternated")
    print("| batch | sampling | plain decode step ms | plain sampler ms | width-1 LOOKAHEAD sampler ms | "
          "difference, % of the decode step: median [rounds] |")
    print("|---|---|---|---|---|---|")
    results = []
    for bs in args.batch:
        for label, kind in kinds.items():
            t = time_samplers(bs, vocab, args.rounds, args.calls, **kind)
            share = 100 * (t["width1"] - t["plain"]) / steps[bs]
            # Each round times both samplers back to back: its difference is a paired one.
            paired = [100 * (w - p) / steps[bs] for w, p in zip(t["rounds"]["width1"], t["rounds"]["plain"])]
            results.append({"batch": bs, "sampling": label, "decode_step_s": steps[bs], **t, "share_pct": share,
                            "share_pct_rounds": paired})
            print(f"| {bs} | {label} | {1e3 * steps[bs]:.1f} | {1e3 * t['plain']:.2f} | {1e3 * t['width1']:.2f} | "
                  f"**{share:+.2f} %** [{min(paired):+.2f} to {max(paired):+.2f}] |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model, "args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
