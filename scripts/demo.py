"""LOOKAHEAD on a tiny local model, on CPU: the same output in fewer model steps.

Builds the tiny random Llama if it is absent (no downloads), then serves
copy-heavy prompts (edit a pasted function and return it whole, quote a
pasted document) with ``sgl.Engine`` three times: plain decoding, SGLang's
NGRAM and LOOKAHEAD.  Each engine serves requests one at a time (batch 1),
then four at once (batch 4), each phase on prompts of its own, so no drafter
has seen the answer before.  Prints tokens/s, the acceptance length (tokens
per model step) and whether every output is identical to plain decoding's.

    python scripts/demo.py [--requests 4] [--num-draft-tokens 8] [--one-branch]

The tiny model has random weights, so what it writes is gibberish that soon
repeats itself, which any drafter predicts well; the point is that
speculation changes nothing in the output and needs fewer model steps.  On
CPU a verify step of this toy model costs more than a decode step, so
tokens/s says little; on a GPU server the step count is what turns into
speed.  SGLang's own start-up messages go to a log file (its path is
printed), not to the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))



def demo_prompts() -> list[str]:
    """Copy-heavy requests on standard-library code and docs: edits returned whole, quotes."""
    import difflib
    import inspect
    import json
    import shlex
    import textwrap

    functions = [textwrap.TextWrapper._wrap_chunks, textwrap.TextWrapper._split, textwrap.dedent,
                 difflib.SequenceMatcher.find_longest_match, difflib.SequenceMatcher.get_opcodes,
                 json.JSONEncoder.iterencode, shlex.shlex.read_token, difflib.unified_diff, textwrap.indent]
    prompts = []
    for i, fn in enumerate(functions):
        code = textwrap.dedent(inspect.getsource(fn))
        if i % 3 == 2:
            doc = inspect.getdoc(fn) or code
            prompts.append(f"Here is a document:\n\n{doc}\n\nQuote its first paragraph exactly.")
        else:
            prompts.append(f"Rename the variable `i` to `index` in this function and return it whole:\n\n{code}")
    return prompts


def requests(n: int) -> tuple[list[str], list[str], list[str]]:
    """(warm-up, batch-1, batch-4) prompts: disjoint sets."""
    reqs = demo_prompts()
    if len(reqs) < 2 * n + 1:
        raise SystemExit(f"--requests {n}: only {len(reqs)} prompts, at most {(len(reqs) - 1) // 2}")
    return reqs[-1:], reqs[:n], reqs[n: 2 * n]


@contextlib.contextmanager
def stderr_to(path: Path):
    """Send this process's and its children's stderr (fd 2) to ``path`` meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def measure(engine, prompts: list[str], sampling: dict, batch: int) -> dict:
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), batch):
        outs += engine.generate(prompts[i: i + batch], sampling)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o["output_ids"]) for o in outs)
    steps = sum(o["meta_info"].get("spec_verify_ct") or len(o["output_ids"]) for o in outs)
    return {"outputs": [o["output_ids"] for o in outs], "texts": [o["text"] for o in outs],
            "tokens": tokens, "seconds": seconds, "steps": steps}


def serve(model: str, engine_kwargs: dict, sampling: dict, warmup, batch1, batch4, log: Path) -> dict:
    import sglang as sgl

    with stderr_to(log):
        engine = sgl.Engine(model_path=model, log_level="error", **engine_kwargs)
    try:
        engine.generate(warmup, {**sampling, "max_new_tokens": 16})  # first-call costs, not measured
        return {1: measure(engine, batch1, sampling, 1), 4: measure(engine, batch4, sampling, 4)}
    finally:
        with stderr_to(log):
            engine.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: the tiny model under .cache/ (built if absent)")
    ap.add_argument("--requests", type=int, default=4, help="requests per phase (batch 1, batch 4)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="verify width per request (root included)")
    ap.add_argument("--one-branch", action="store_true", help="LOOKAHEAD drafts a chain instead of a tree")
    ap.add_argument("--log", default=None, help="where SGLang's messages go (default: .cache/demo_sglang.log)")
    args = ap.parse_args(argv)

    from lookahead.testing.cpu_env import apply_cpu_env, cpu_engine_kwargs, default_cache_dir

    apply_cpu_env()
    model = args.model_path
    if model is None:
        from lookahead.testing.tiny_model import build_tiny_model

        print("building the tiny model (once, about 10 s)...", flush=True)
        model = str(build_tiny_model(default_cache_dir() / "tiny-llama-seed0", seed=0))
    log = Path(args.log) if args.log else default_cache_dir() / "demo_sglang.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    warmup, batch1, batch4 = requests(args.requests)
    sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    base = cpu_engine_kwargs(max_total_tokens=16384, max_running_requests=4)
    spec = {"speculative_num_draft_tokens": args.num_draft_tokens}
    mode = "chain" if args.one_branch else "tree"
    configs = [
        ("plain", base),
        ("NGRAM", {**base, **spec, "speculative_algorithm": "NGRAM"}),
        (f"LOOKAHEAD ({mode})", {**base, **spec, "speculative_algorithm": "LOOKAHEAD",
                                 "speculative_one_branch": args.one_branch}),
    ]
    print(f"model: {model}")
    print(f"{args.requests} copy-heavy requests per phase, greedy, verify width {args.num_draft_tokens}; "
          f"SGLang's messages: {log}", flush=True)
    results = {}
    for name, kwargs in configs:
        t0 = time.time()
        print(f"  {name}...", end="", flush=True)
        results[name] = serve(model, kwargs, sampling, warmup, batch1, batch4, log)
        print(f" {time.time() - t0:.0f} s", flush=True)

    plain = results["plain"]
    identical = all(r[b]["outputs"] == plain[b]["outputs"] for r in results.values() for b in (1, 4))
    print()
    print("| batch | decoding | tokens | model steps | AL (tokens/step) | tokens/s | vs plain | identical to plain |")
    print("|---|---|---|---|---|---|---|---|")
    for b in (1, 4):
        for name, r in results.items():
            p = r[b]
            rate = p["tokens"] / p["seconds"]
            ratio = rate / (plain[b]["tokens"] / plain[b]["seconds"])
            print(f"| {b} | {name} | {p['tokens']} | {p['steps']} | {p['tokens'] / p['steps']:.2f} | {rate:.1f} | "
                  f"{ratio:.2f}x | {'yes' if p['outputs'] == plain[b]['outputs'] else 'NO'} |")
    print()
    for b in (1, 4):
        rate = {name: r[b]["tokens"] / r[b]["seconds"] for name, r in results.items()}
        al = {name: r[b]["tokens"] / r[b]["steps"] for name, r in results.items()}
        la_name = configs[2][0]
        print(f"batch {b}: LOOKAHEAD {rate[la_name] / rate['plain']:.2f}x plain and "
              f"{rate[la_name] / rate['NGRAM']:.2f}x NGRAM in tokens/s; AL {al[la_name]:.2f} against NGRAM's "
              f"{al['NGRAM']:.2f} ({al[la_name] / al['NGRAM']:.2f}x)")
    print(f"outputs identical to plain decoding: {identical}")
    if not identical:
        for name, r in results.items():
            for b in (1, 4):
                for i, (a, c) in enumerate(zip(plain[b]["outputs"], r[b]["outputs"])):
                    if a != c:
                        at = next((k for k, (x, y) in enumerate(zip(a, c)) if x != y), min(len(a), len(c)))
                        print(f"  {name}, batch {b}, request {i}: differs from token {at}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
