"""Sampled acceptance of recorded RL rollouts, replayed without a model.

Why this is exact for sampling, not only for greedy decoding: a drafted
token is accepted with the target's probability of it, and a tree's siblings
are tried against the residual distribution, so the emitted tokens are
distributed as plain decoding's and a step accepts exactly the longest root
path of the draft that the emitted text follows. Replaying a recorded sample
(any decoding's: all of them sample the target's distribution) and counting
the longest matching path therefore estimates the sampled AL without bias,
for the same history. So rollout drafting can be tuned here, on the tuning
set's rollouts, in seconds instead of engine hours.

The replay reads ``bench_rollout.py --json`` output: every round's every
decoding is one rollout of ``--steps`` steps of the same prompts. For each,
a fresh drafter serves the steps in order, the requests of a step (the
prompts, each ``group`` times) in lock-step as one batch: each step drafts
for every live request, then gives each the tokens its draft earned (the
longest matching path, plus the bonus token). The first token of an answer
comes from the prefill, as in the engine, and counts as a step (the
accounting of docs/benchmarks.md). The weight change between steps is in
the recorded text.

    python benchmarks/replay_rollouts.py --rollouts rollout.json [--budget 7] [--drafters lookahead,ngram]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from copy_bound import seen_chain  # noqa: E402  (beside this script)
from lookahead.replay import accepted_length, baselines  # noqa: E402


class PairOracle:
    """A ceiling, not a drafter: it knows each answer and drafts its next
    tokens up to the first pair of tokens not seen before the step (in a
    prompt or in text emitted so far, the siblings' included). Any draft
    taken from seen text, however it joins sources, is a chain of seen pairs,
    so none accepts more at a step (the trie's rare wildcard drafts, which
    guess past an unseen pair, excepted). Its AL is what drafting from this
    history could reach if the samples were known in advance."""

    name = "pair-oracle"

    def __init__(self):
        self.pairs, self.answers = set(), {}

    def start(self, rid, prompt, answer):
        self.answers[rid] = (len(prompt), answer.tolist())
        self.pairs.update(zip(prompt.tolist(), prompt[1:].tolist()))

    def draft(self, rid, context, budget):
        prompt_len, answer = self.answers[rid]
        want = answer[len(context) - prompt_len:][:budget]
        tokens = want[: seen_chain(self.pairs, int(context[-1]), want)]
        return tokens, list(range(-1, len(tokens) - 1))

    def accept(self, rid, context, new_tokens):
        tail = context[-len(new_tokens) - 1:].tolist()
        self.pairs.update(zip(tail, tail[1:]))

    def finish(self, rid):
        self.answers.pop(rid)


def make(name: str, budget: int):
    if name == "pair-oracle":
        return PairOracle()
    if name == "lookahead":
        return baselines.LookaheadDrafter(one_branch=False, background=False)
    if name == "ngram":
        return baselines.NgramDrafter(budget)
    raise SystemExit(f"unknown drafter {name!r}: lookahead or ngram")


def replay_rollout(drafter, prompts: list[np.ndarray], steps: list[list], budget: int) -> list[tuple[int, int]]:
    """(tokens, steps) per training step. ``steps[s]``: step s's outputs, the
    prompts' groups in order (prompt i's group is outputs[i*g:(i+1)*g])."""
    out = []
    rid = 0
    for outputs in steps:
        group = len(outputs) // len(prompts)
        live = {}
        for j, answer in enumerate(outputs):
            prompt = prompts[j // group]
            live[rid] = [prompt, np.asarray(answer, dtype=np.int32), 0]
            if isinstance(drafter, PairOracle):  # the ceiling is told the answer
                drafter.start(rid, prompt, live[rid][1])
            else:
                drafter.start(rid, prompt)
            rid += 1
        tokens = sum(len(v[1]) for v in live.values())
        count = 0
        while live:
            for r in [r for r, v in live.items() if v[2] >= len(v[1])]:  # answered: shared, as finish() does
                drafter.finish(r)
                del live[r]
            earned = {}
            for r, (prompt, answer, i) in live.items():  # one batch: every draft sees the text before this step
                if i == 0:  # the prefill gives every answer its first token, with no draft
                    earned[r] = 1
                    continue
                draft_tokens, parents = drafter.draft(r, np.concatenate([prompt, answer[:i]]), budget)[:2]
                earned[r] = min(accepted_length(draft_tokens, parents, answer[i:]) + 1, len(answer) - i)
            for r, n in earned.items():
                prompt, answer, i = live[r]
                drafter.accept(r, np.concatenate([prompt, answer[: i + n]]), answer[i: i + n])
                live[r][2] = i + n
            count += len(earned)
        out.append((tokens, count))
    return out


def run(args) -> dict:
    data = json.loads(Path(args.rollouts).read_text())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(data["model"])
    prompts = [np.asarray(tokenizer(p, add_special_tokens=False)["input_ids"], dtype=np.int32) for p in data["prompts"]]
    sources = args.sources.split(",") if args.sources else list(data["rounds"][0])
    results = {}
    for name in args.drafters.split(","):
        per_rollout = []
        for rnd in data["rounds"]:
            for src in sources:
                steps = [s["outputs"] for s in rnd[src]]
                per_rollout.append(replay_rollout(make(name, args.budget), prompts, steps, args.budget))
        n_steps = len(per_rollout[0])
        al = [[t / c for t, c in r] for r in per_rollout]
        pooled = [sum(r[s][0] for r in per_rollout) / sum(r[s][1] for r in per_rollout) for s in range(n_steps)]
        growth = [a[-1] / a[0] for a in al]
        results[name] = {"pooled_al": pooled, "al": al, "growth": growth}
        print(f"{name}: AL by step (pooled over {len(per_rollout)} rollouts) "
              + " ".join(f"{x:.3f}" for x in pooled)
              + f"; step {n_steps}/step 1 pooled {pooled[-1] / pooled[0]:.3f}, per rollout median "
              f"{statistics.median(growth):.3f} [{min(growth):.3f}-{max(growth):.3f}]", flush=True)
    return results


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", required=True, help="a bench_rollout.py --json file")
    ap.add_argument("--budget", type=int, default=7, help="draft tokens per step (verify width - 1)")
    ap.add_argument("--drafters", default="lookahead,ngram", help="lookahead, ngram, pair-oracle (a ceiling)")
    ap.add_argument("--sources", default=None, help="whose recorded rollouts (default: every decoding's)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    run(parse())
