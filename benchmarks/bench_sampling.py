"""Sampled traffic on a real LLM: tokens/s against plain decoding at each
temperature and batch size, with every server resident and the order
rotated per measurement.

Chat services sample near temperature 0.7 and RL rollouts at 1.0; there a
drafted token is accepted with the target's probability of it, so
speculation gains less, and a step that does not speculate must cost what
plain decoding's step costs. Servers: plain decoding, SGLang's NGRAM (on
CPU it samples through the test environment's stand-in of SGLang's CUDA
sampling kernel, see ``cpu/cpu_sgl_kernel/sitecustomize.py``), LOOKAHEAD
with its default cut-off (``--speculative-lookahead-max-batch-size 4``) and
with ``auto``. A cell (temperature, batch size, round) sends the same
``batch`` requests to every server in turn, rotated per round, as one batch
each; every cell draws requests of its own (edit, QA and chat, from the
report set of ``real_workloads`` unless ``--set tuning``), so no server has seen them before.

    python benchmarks/bench_sampling.py [--temperatures 0.7 1.0] [--batch 1 4 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

import real_workloads  # noqa: E402

SERVERS = {
    "plain": [],
    "NGRAM": ["--speculative-algorithm", "NGRAM"],
    "LOOKAHEAD": ["--speculative-algorithm", "LOOKAHEAD"],
    "LOOKAHEAD-auto": ["--speculative-algorithm", "LOOKAHEAD", "--speculative-lookahead-max-batch-size", "auto"],
}
KINDS = ("edit", "qa", "chat")


def post(url: str, body: dict, timeout: float = 900) -> dict:
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def serve_batch(url: str, prompts: list[str], sampling: dict) -> dict:
    """The prompts sent at once (one batch); tokens, seconds and model steps."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda p: post(url, {"text": p, "sampling_params": sampling}), prompts))
    seconds = time.perf_counter() - t0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    # Steps as docs/benchmarks.md counts them for every decoding: the prefill
    # (which gives the first token), then each decode or verify step.
    steps = sum(1 + o["meta_info"]["spec_verify_ct"] if o["meta_info"].get("spec_verify_ct")
                else o["meta_info"]["completion_tokens"] for o in outs)
    return {"tokens": tokens, "seconds": seconds, "steps": steps}


def spread(values: list[float]) -> str:
    return f"**{statistics.median(values):.2f}** [{min(values):.2f}-{max(values):.2f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct, fetched on first use")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--num-draft-tokens", type=int, default=8)
    ap.add_argument("--configs", default=",".join(SERVERS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", default="report", choices=("tuning", "report"), help="which requests (real_workloads)")
    ap.add_argument("--out-dir", default="artifacts/bench_sampling")
    args = ap.parse_args(argv)

    from cpu_env import cpu_env, cpu_server_args
    from real_model import real_model_path
    from transformers import AutoTokenizer

    from lookahead.validate.server import SGLangServer

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = args.model_path or real_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model)
    env = cpu_env()
    env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "0")  # one compute thread per scheduler
    base = cpu_server_args(dtype=args.dtype, max_running_requests=max(args.batch), max_total_tokens=32768)
    names = [c for c in args.configs.split(",") if c]
    cells = [(t, b, r) for t in args.temperatures for b in args.batch for r in range(args.rounds)]
    need = sum(b for _, b, _ in cells) + 2
    per_kind = -(-need // len(KINDS))
    convs = [c for kind in KINDS for c in real_workloads.conversations(kind, per_kind, args.seed, which=args.set)]
    # Interleave the kinds, so every cell mixes them.
    convs = [convs[k * per_kind + i] for i in range(per_kind) for k in range(len(KINDS))]
    pool = [real_workloads.render(tokenizer, c) for c in convs]
    print(f"model: {model} ({args.dtype}); temperatures {args.temperatures}, batch sizes {args.batch}, "
          f"{args.rounds} rounds, order rotated; {args.max_new_tokens} new tokens; width {args.num_draft_tokens}",
          flush=True)
    figures: dict = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name in names:
            flags = list(SERVERS[name])
            if name != "plain":
                flags += ["--speculative-num-draft-tokens", str(args.num_draft_tokens)]
            servers[name] = stack.enter_context(SGLangServer(model, base + flags, env, out_dir / f"server_{name}.log"))
            warm = {"temperature": 0.7, "max_new_tokens": 8}
            serve_batch(servers[name].url, ["Say hello.", "Count to three."], warm)  # not measured
        taken = 0
        for i, (t, b, r) in enumerate(cells):
            prompts = pool[taken: taken + b]
            taken += b
            sampling = {"temperature": t, "max_new_tokens": args.max_new_tokens}
            order = names[i % len(names):] + names[: i % len(names)]
            for name in order:
                figures.setdefault((t, b), {}).setdefault(name, []).append(
                    serve_batch(servers[name].url, prompts, sampling))
            line = ", ".join(f"{n} {figures[(t, b)][n][-1]['tokens'] / figures[(t, b)][n][-1]['seconds']:.1f}"
                             for n in names)
            print(f"  T={t} batch {b} round {r + 1}: tokens/s {line}", flush=True)
        for name, server in servers.items():
            if name.startswith("LOOKAHEAD"):
                with urllib.request.urlopen(server.url + "/get_server_info", timeout=60) as resp:
                    state = json.loads(resp.read())["internal_states"][0].get("lookahead")
                (out_dir / f"stats_{name}.json").write_text(json.dumps(state, indent=1))
    print("\n| temperature | batch | decoding | tokens/s vs plain (median [range]) | AL |")
    print("|---|---|---|---|---|")
    summary = []
    for (t, b), per in figures.items():
        for name in names:
            ratios = [x["tokens"] / x["seconds"] / (p["tokens"] / p["seconds"]) for x, p in zip(per[name], per["plain"])]
            al = sum(x["tokens"] for x in per[name]) / sum(x["steps"] for x in per[name])
            summary.append({"temperature": t, "batch": b, "config": name, "vs_plain": ratios, "al": al,
                            "rounds": per[name]})
            print(f"| {t} | {b} | {name} | {spread(ratios)} | {al:.2f} |")
    (out_dir / "bench_sampling.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwrote {out_dir / 'bench_sampling.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
