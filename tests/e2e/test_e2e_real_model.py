"""LOOKAHEAD on a real pretrained LLM (SmolLM2-135M-Instruct) in real SGLang on CPU.

The tiny models prove the mechanics; this proves the claim where users
meet it.  Requests are the demo's kinds (``benchmarks/real_workloads.py``): a
code edit that returns the whole function, a question over a pasted
document, open chat, each at batch 1, then served again four at once.

* float32: every output equals plain decoding's, token for token, with a
  tree of width 8 (the tiny-model tests cover chains and other widths).
* bfloat16 (what users serve in): a verify forward and a decode step round
  differently, so greedy decoding may part from plain decoding where plain
  decoding's own two best tokens were nearly tied.  Every LOOKAHEAD parting
  must be such a near tie (``lookahead/validate/numerics.py``); NGRAM, run alongside,
  is counted the same way, and both are reported per 1,000 tokens.

All engines run in one subprocess (``e2e_driver.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lookahead.validate import numerics
from e2e_driver import run_driver


import real_workloads  # noqa: E402

GREEDY = {"temperature": 0.0, "max_new_tokens": 64}
ENGINE = {"max_total_tokens": 16384, "max_running_requests": 4}
KINDS = ("edit", "qa", "chat")
GROUPS = [[0], [1], [2], [3, 4, 5]]  # batch 1, then the three again at once
TOP = 5
REPORT: list = []  # lines for the terminal summary (conftest.py prints them)


def _prompts(model: str) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    convs = []
    for kind in dict.fromkeys(KINDS):
        convs += real_workloads.conversations(kind, KINDS.count(kind), seed=7)
    texts = [real_workloads.render(tok, c) for c in convs]
    return texts + texts


def _spec(algorithm: str, width: int) -> dict:
    return {"speculative_algorithm": algorithm, "speculative_num_draft_tokens": width}


@pytest.fixture(scope="module")
def runs(real_model, cpu_subprocess_env, tmp_path_factory):
    texts = _prompts(real_model)
    assert len(texts) - 1 == max(i for g in GROUPS for i in g)
    runs = []
    for dtype in ("float32", "bfloat16"):
        configs = {"plain": {}, "tree": _spec("LOOKAHEAD", 8)}
        if dtype == "bfloat16":
            configs = {"plain": {}, "tree": _spec("LOOKAHEAD", 8), "ngram": _spec("NGRAM", 8)}
        for name, spec in configs.items():
            run = {"name": f"{dtype}:{name}", "engine": {**ENGINE, "dtype": dtype, **spec}, "sampling": GREEDY,
                   "groups": GROUPS}
            if dtype == "bfloat16" and name == "plain":
                run["top_logprobs"] = TOP  # where plain decoding's own two best were close
            runs.append(run)
    return run_driver({"model": real_model, "prompts": texts, "runs": runs},
                      tmp_path_factory.mktemp("real"), cpu_subprocess_env, timeout=2400)["runs"]


def _tokens(run: dict) -> int:
    return sum(len(o["output_ids"]) for o in run["outputs"].values())


def test_float32_output_is_identical_to_plain_decoding(runs):
    plain, got = runs["float32:plain"]["outputs"], runs["float32:tree"]["outputs"]
    for i in plain:
        assert got[i]["output_ids"] == plain[i]["output_ids"], f"request {i} ({KINDS[int(i) % len(KINDS)]})"


@pytest.mark.parametrize("run", ["float32:tree", "bfloat16:tree"])
def test_speculation_ran_and_accepted_drafts(runs, run):
    outs = runs[run]["outputs"].values()
    steps = sum(o["spec_verify_ct"] for o in outs)
    assert steps > 0
    # More than one token per model step overall: drafts were accepted.
    assert _tokens(runs[run]) / steps > 1.5


def _partings(runs: dict, name: str) -> numerics.Comparison:
    plain = runs["bfloat16:plain"]["outputs"]
    got = runs[f"bfloat16:{name}"]["outputs"]
    tolerance, tie = numerics.HALF_PRECISION["bfloat16"]
    out = numerics.Comparison()
    for i, ref in plain.items():
        numerics.compare({"output_ids": ref["output_ids"]}, {"output_ids": got[i]["output_ids"]},
                         {"output_top_logprobs": ref["output_top_logprobs"]}, tolerance, tie,
                         where=f"request {i}", into=out)
    return out


def test_bfloat16_partings_are_near_ties_of_plain_decoding(runs):
    tokens = _tokens(runs["bfloat16:plain"])
    line = [f"bfloat16 partings from plain decoding over {tokens} plain tokens ({len(GROUPS[-1]) * 2} requests):"]
    for name in ("tree", "ngram"):
        c = _partings(runs, name)
        n = len(c.near_ties) + len(c.differences)
        margins = ", ".join(f"{m:.3f}" for _, _, m in c.near_ties)
        line.append(f"  {'LOOKAHEAD' if name == 'tree' else 'NGRAM'}: {n} ({1000 * n / tokens:.1f} per 1,000 tokens); "
                    f"near ties {len(c.near_ties)} (margins {margins or '-'}); not near ties {len(c.differences)}"
                    + (f": {c.differences[:3]}" if c.differences else ""))
        if name == "tree":
            lookahead = c
    REPORT.append("\n".join(line))
    assert not lookahead.differences, "\n".join(lookahead.differences)
