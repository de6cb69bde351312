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
  Then every emitted token, not only the first parting, is teacher-forced
  through one plain prefill and must be its argmax or within 0.25 nats of
  it, for LOOKAHEAD and NGRAM alike; the same check must fail on what a
  verifier that accepts the runner-up at gaps under 0.4 nats would emit (the
  smallest such margin bfloat16's coarse logits let a check tell apart).

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


@pytest.fixture(scope="module")
def teacher_forced(runs, real_model, cpu_subprocess_env, tmp_path_factory):
    """Every bfloat16 answer teacher-forced through one plain bfloat16 prefill,
    and the lossy verifier's answers built from plain decoding's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_model)
    texts = _prompts(real_model)
    prompts = [tok.encode(t) for t in texts]
    order = sorted(runs["bfloat16:plain"]["outputs"], key=int)
    outputs = {name: [runs[f"bfloat16:{name}"]["outputs"][i]["output_ids"] for i in order]
               for name in ("plain", "tree", "ngram")}
    spec = {"model": real_model, "engine": {**ENGINE, "dtype": "bfloat16"},
            "prompts": [prompts[int(i)] for i in order], "outputs": outputs, "lossy_from": "plain",
            "lossy_high": LOSSY_HIGH}
    return run_driver(spec, tmp_path_factory.mktemp("teacher"), cpu_subprocess_env, driver="teacher_force_driver.py",
                      timeout=600)


# The lossy verifier accepts the runner-up wherever it is less than this many
# nats below the best. bfloat16 logits of this model's magnitude (8-32) come in
# steps of 1/16 to 1/8, so the gaps under 0.3 are 0.25 and less, which a
# lossless verifier may emit too (plain decoding's own answers show a 0.25 gap
# under teacher forcing); 0.4 is the smallest such margin whose acceptances
# bfloat16 can show above 0.25 here (gaps of 0.3125 and 0.375).
LOSSY_HIGH = 0.4


def _forced(teacher_forced: dict, name: str) -> numerics.TeacherForced:
    return numerics.check_teacher_forced(list(zip(teacher_forced["outputs"][name], teacher_forced["gaps"][name])))


def test_bfloat16_every_emitted_token_is_plain_decodings_argmax_or_a_near_tie(teacher_forced):
    line = ["bfloat16, every emitted token teacher-forced through one plain prefill "
            f"(margin {numerics.TEACHER_FORCED_MARGIN} nats):"]
    checks = {}
    for name, label in (("tree", "LOOKAHEAD"), ("ngram", "NGRAM"), ("plain", "plain"), ("lossy", "lossy verifier")):
        checks[name] = _forced(teacher_forced, name)
        line.append(f"  {label}: {checks[name].summary()}")
    REPORT.append("\n".join(line))
    assert checks["tree"].tokens >= 300
    assert checks["tree"].passed, checks["tree"].violations[:5]


def test_the_teacher_forced_check_fails_a_lossy_verifier(teacher_forced):
    # What a verifier accepting the runner-up at gaps under LOSSY_HIGH nats
    # emits at the first place it would (a gap above the check's margin),
    # after plain decoding's own tokens: the check must flag it there.
    lossy = _forced(teacher_forced, "lossy")
    assert lossy.requests >= 1, f"no position of plain decoding's answers had a runner-up 0.25-{LOSSY_HIGH} nats below"
    assert not lossy.passed
    # Caught at the runner-up it emitted: every violation is there, or is one
    # plain decoding's own answer (the lossy answer's prefix) has too.
    plain = {(r, k) for r, k, _ in _forced(teacher_forced, "plain").violations}
    source = teacher_forced["lossy_requests"]
    ends = {r: len(o) - 1 for r, o in enumerate(teacher_forced["outputs"]["lossy"])}
    assert any(k == ends[r] for r, k, _ in lossy.violations), lossy.violations
    assert all(k == ends[r] or (source[r], k) in plain for r, k, _ in lossy.violations), lossy.violations
