"""Drafting alone, on the same texts: a ``bench_workloads.py`` run replayed model-free.

In bfloat16 each decoding's answers part from plain decoding's at near ties,
so in a real run LOOKAHEAD and NGRAM each draft on text of their own (a
repeated request whose answer parted from the first one leaves every drafter
without the text). Replaying every decoding's answers through both drafters
compares the drafting itself. The phases are replayed in the order served
(``edit``, ``qa``, ``chat``, ``turn2``, then the batch-4 phase one request at
a time: interleaving it moved AL by under 1 % in our runs), each drafter
keeping what the earlier phases taught it. AL = response tokens / steps.
Each cell ends in the phase's two copy bounds (``copy_bound``): the AL of a
drafter that, knowing the answer, copies at each step the best continuation
of the context's last token from anything served before, the prompt or the
answer so far (contiguous, single source); then of one that may chain any
pairs of tokens seen so far (re-anchoring). How close a drafter is to them
says how much drafting has left. The last column pools the phases.

    python benchmarks/replay_workloads.py docs/bench_workloads_cpu.json [--budget 7]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

from copy_bound import copy_bound_steps  # noqa: E402

from lookahead.replay import make_drafter, replay  # noqa: E402


def _cell(counts) -> str:
    la, ng, bound, reanchored = counts[0] / counts[1:]
    return f"{la:.2f} / {ng:.2f} ({la / ng:.2f}x) <= {bound:.2f} / {reanchored:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="a bench_workloads.py --json file (with its prompts)")
    ap.add_argument("--budget", type=int, default=7, help="draft tokens per step (width 8: 7)")
    ap.add_argument("--tokenizer", default=None, help="default: the run's model")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    run = json.loads(Path(args.json).read_text())
    if args.tokenizer is None and "model" not in run:  # one round of a --rounds run: the default model
        from real_model import real_model_path

        args.tokenizer = real_model_path()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or run["model"])
    phases = list(next(iter(run["runs"].values())))
    print(f"{args.json}: budget {args.budget}; AL of LOOKAHEAD / NGRAM per phase, on each decoding's texts, "
          "and the copy bounds (contiguous / re-anchoring)")
    timed = {}  # decoding -> [tokens, seconds, seconds at the two bounds' steps], over the phases
    print("| texts of | " + " | ".join(phases) + " | all |")
    print("|---" * (len(phases) + 2) + "|")
    for name, decoding in run["runs"].items():
        cells = []
        drafters = {d: make_drafter(d, args.budget) for d in ("lookahead", "ngram")}
        served = []  # every prompt and answer so far: what the bound may copy from
        pooled = np.zeros(5)  # response tokens; steps of LOOKAHEAD, NGRAM, the two bounds
        for phase in phases:
            fig = decoding[phase]
            if "prompts" not in fig:
                raise SystemExit(f"{args.json} has no prompts: rerun bench_workloads.py to write them")
            pairs = [(np.asarray(tokenizer.encode(p), dtype=np.int32), np.asarray(o, dtype=np.int32))
                     for p, o in zip(fig["prompts"], fig["outputs"])]
            counts = np.zeros(5)
            counts[0] = sum(len(out) for _, out in pairs)
            counts[1:3] = [replay(dr, pairs, args.budget).steps for dr in drafters.values()]
            engine_steps = np.zeros(2)  # the bounds' steps counted as the engine counts them (prefill included)
            for prompt, out in pairs:
                # The replay drafts the first token too (no prefill step): so do the bounds here.
                for i, reanchor in ((3, False), (4, True)):
                    counts[i] += copy_bound_steps(served, prompt, out, args.budget + 1, prefill=False,
                                                  reanchor=reanchor)
                    engine_steps[i - 3] += copy_bound_steps(served, prompt, out, args.budget + 1, reanchor=reanchor)
                served += [prompt, out]
            if fig.get("seconds") and fig.get("steps"):
                per_step = fig["seconds"] / fig["steps"]
                timed[name] = timed.get(name, 0) + np.array([fig["tokens"], fig["seconds"], *per_step * engine_steps])
            pooled += counts
            cells.append(_cell(counts))
        print(f"| {name} | " + " | ".join(cells + [_cell(pooled)]) + " |")
    _print_ceilings(timed)
    return 0


def _print_ceilings(timed: dict) -> None:
    """Tokens/s over the run's best NGRAM setting, measured and as it would be
    had each phase taken the bounds' steps at the decoding's measured cost per
    step: how far better drafting could take this run's speed."""
    ngrams = {n: t for n, t in timed.items() if n.startswith("NGRAM")}
    if not ngrams:
        return
    best = max(ngrams, key=lambda n: ngrams[n][0] / ngrams[n][1])
    best_rate = ngrams[best][0] / ngrams[best][1]
    for name, (tokens, seconds, at_bound, at_reanchored) in timed.items():
        if name.startswith("LOOKAHEAD"):
            print(f"{name} tokens/s over {best} (this run's best NGRAM): {tokens / seconds / best_rate:.2f}x measured, "
                  f"{tokens / at_bound / best_rate:.2f}x / {tokens / at_reanchored / best_rate:.2f}x at the "
                  "contiguous / re-anchoring bound's steps and its own cost per step")


if __name__ == "__main__":
    sys.exit(main())
