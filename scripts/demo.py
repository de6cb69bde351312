"""LOOKAHEAD on a tiny local model, on CPU: same outputs, fewer steps.

Builds the tiny random Llama if it is absent (no downloads), then decodes a
few copy-heavy prompts (an edit of a code file, a question over a pasted
document) with ``sgl.Engine`` twice: plain decoding, then LOOKAHEAD.  Prints
tokens/s, the acceptance length and whether the outputs are identical.

    python scripts/demo.py [--max-new-tokens 96] [--num-draft-tokens 8] [--one-branch]

The tiny model has random weights, so what it writes is gibberish that soon
repeats itself; the point is that speculation changes nothing in the output
and needs fewer model steps.  On CPU each verify step costs more than a
decode step of this toy model, so tokens/s says little; on a GPU server the
step count is what turns into speed.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def demo_prompts() -> list[str]:
    code = inspect.getsource(textwrap.TextWrapper._wrap_chunks)
    document = textwrap.dedent(inspect.getsource(textwrap.dedent))
    return [
        "Rename the variable `lines` to `out` in this function and return the whole file:\n\n" + code,
        "Here is a document:\n\n" + document + "\n\nQuote the sentence that explains what dedent does.",
        "Repeat this list twice: alpha, beta, gamma, delta, epsilon, zeta, eta, theta.",
    ]


def run(model: str, engine_kwargs: dict, sampling: dict, prompts: list[str]) -> dict:
    import sglang as sgl

    engine = sgl.Engine(model_path=model, log_level="error", **engine_kwargs)
    try:
        engine.generate(prompts[:1], {**sampling, "max_new_tokens": 4})  # warm-up
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sampling)
        seconds = time.perf_counter() - t0
    finally:
        engine.shutdown()
    tokens = sum(len(o["output_ids"]) for o in outs)
    steps = sum(o["meta_info"].get("spec_verify_ct") or len(o["output_ids"]) for o in outs)
    return {"outputs": [o["output_ids"] for o in outs], "texts": [o["text"] for o in outs],
            "tokens": tokens, "seconds": seconds, "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: the tiny model under .cache/ (built if absent)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="verify width per request (root included)")
    ap.add_argument("--one-branch", action="store_true", help="draft a chain instead of a tree")
    args = ap.parse_args(argv)

    from lookahead.testing.cpu_env import apply_cpu_env, cpu_engine_kwargs, default_cache_dir

    apply_cpu_env()
    model = args.model_path
    if model is None:
        from lookahead.testing.tiny_model import build_tiny_model

        print("building the tiny model (once, about 10 s)...", flush=True)
        model = str(build_tiny_model(default_cache_dir() / "tiny-llama-seed0", seed=0))

    prompts = demo_prompts()
    sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    base = cpu_engine_kwargs(max_total_tokens=8192, max_running_requests=4)
    print("plain decoding...", flush=True)
    plain = run(model, base, sampling, prompts)
    print("LOOKAHEAD...", flush=True)
    lookahead = run(model, {**base, "speculative_algorithm": "LOOKAHEAD",
                            "speculative_num_draft_tokens": args.num_draft_tokens,
                            "speculative_one_branch": args.one_branch}, sampling, prompts)

    identical = plain["outputs"] == lookahead["outputs"]
    al = lookahead["tokens"] / lookahead["steps"]
    mode = "one branch" if args.one_branch else "tree"
    print()
    print("| decoding | tokens | model steps | tokens/step | tokens/s |")
    print("|---|---|---|---|---|")
    for name, r in (("plain", plain), (f"LOOKAHEAD ({mode}, width {args.num_draft_tokens})", lookahead)):
        print(f"| {name} | {r['tokens']} | {r['steps']} | {r['tokens'] / r['steps']:.2f} | "
              f"{r['tokens'] / r['seconds']:.1f} |")
    print()
    print(f"acceptance length: {al:.2f} tokens per verify step")
    print(f"outputs identical to plain decoding: {identical}")
    if not identical:
        for i, (a, b) in enumerate(zip(plain["outputs"], lookahead["outputs"])):
            if a != b:
                print(f"  prompt {i} differs at token {next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)}")
    return 0 if identical and al > 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
