"""How well the tiny copier copies, measured in real SGLang (CPU, plain greedy decoding).

Two figures, on standard-library modules that training never read
(``copier_tasks.HELD_OUT``):

* **edits**: "rename `a` to `b` in this code and return it whole" on held-out
  functions and classes. The unchanged lines (those without the old name) that
  the answer reproduces token for token, found by aligning answer lines with
  the expected ones (``difflib``), over all unchanged lines. Also: renamed
  lines right, and answers right as a whole.
* **open prompts**: "write a function named ..." answered in up to 128 tokens;
  an answer loops when a block of at most 32 tokens repeats back to back over at
  least 24 tokens (three periods at least). Also: distinct tokens per answer.

    python scripts/eval_copier.py [--model-path lookahead/testing/tiny_copier] [--edits 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import copier_tasks as tasks  # noqa: E402
from lookahead.testing import TINY_COPIER  # noqa: E402

OPEN_PROMPTS = [
    "Write a Python function named `parse_header` that splits a header line into a name and a value.",
    "Write a Python class named `LineCounter`.",
    "Write a Python function named `merge_sorted`.",
    "Write a Python function named `read_config` that reads a file of key = value lines.",
    "Write a Python class named `Cache` with get and put methods.",
    "Write a Python function named `format_table`.",
    "Write a Python function named `walk_files`.",
    "Write a Python class named `Token`.",
]


def loops(tokens: list[int], max_period: int = 32, min_span: int = 24) -> bool:
    """Whether some block of at most ``max_period`` tokens repeats back to back over ``min_span`` tokens."""
    for p in range(1, max_period + 1):
        run = 0
        for i in range(p, len(tokens)):
            run = run + 1 if tokens[i] == tokens[i - p] else 0
            if run + p >= max(min_span, 3 * p):
                return True
    return False


def evaluate(engine, tokenizer, n_edits: int) -> dict:
    cases = tasks.held_out_requests(tokenizer, n_edits)
    prompts = [c["prompt"] for c in cases]
    budgets = [len(tokenizer(c["expected"], add_special_tokens=False)["input_ids"]) + 32 for c in cases]
    outs = [engine.generate(p, {"temperature": 0, "max_new_tokens": b}) for p, b in zip(prompts, budgets)]
    unchanged = reproduced = renamed = renamed_ok = exact = 0
    for case, out in zip(cases, outs):
        score = tasks.score_edit(case, out["text"])
        unchanged += score["unchanged"]
        reproduced += score["unchanged_kept"]
        renamed += score["renamed"]
        renamed_ok += score["renamed_kept"]
        exact += out["text"].split(tasks.END)[0].rstrip() == case["expected"]
    open_outs = [engine.generate(tasks.chat(p), {"temperature": 0, "max_new_tokens": 128}) for p in OPEN_PROMPTS]
    looped = [loops(o["output_ids"]) for o in open_outs]
    return {
        "edit_requests": len(cases),
        "unchanged_lines": unchanged,
        "unchanged_lines_reproduced": reproduced,
        "unchanged_reproduced_fraction": reproduced / max(1, unchanged),
        "renamed_lines": renamed,
        "renamed_lines_right": renamed_ok,
        "answers_exact": exact,
        "open_prompts": len(OPEN_PROMPTS),
        "open_answers_looping": sum(looped),
        "open_distinct_token_fraction": sum(len(set(o["output_ids"])) / max(1, len(o["output_ids"]))
                                            for o in open_outs) / len(open_outs),
        "open_answers": [o["text"] for o in open_outs],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=str(TINY_COPIER))
    ap.add_argument("--edits", type=int, default=40)
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--show", type=int, default=1, help="print this many open answers")
    args = ap.parse_args(argv)

    from lookahead.testing.cpu_env import apply_cpu_env, cpu_engine_kwargs

    apply_cpu_env()
    import sglang as sgl
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    engine = sgl.Engine(model_path=args.model_path, log_level="error",
                        **cpu_engine_kwargs(max_total_tokens=32768, max_running_requests=8))
    try:
        r = evaluate(engine, tokenizer, args.edits)
    finally:
        engine.shutdown()
    print(f"edits: {r['unchanged_lines_reproduced']} of {r['unchanged_lines']} unchanged lines reproduced "
          f"({100 * r['unchanged_reproduced_fraction']:.1f} %), {r['renamed_lines_right']} of {r['renamed_lines']} "
          f"renamed lines right, {r['answers_exact']} of {r['edit_requests']} answers exact")
    print(f"open prompts: {r['open_answers_looping']} of {r['open_prompts']} answers loop within 128 tokens; "
          f"{100 * r['open_distinct_token_fraction']:.0f} % distinct tokens per answer")
    for text in r["open_answers"][: args.show]:
        print("---\n" + text)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
