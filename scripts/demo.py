"""LOOKAHEAD on a tiny local model, on CPU: the same output, sooner.

Serves copy-heavy requests (rename a name in a pasted function or class and
return it whole) with ``sgl.Engine`` three times: plain
decoding, SGLang's NGRAM and LOOKAHEAD. Each engine serves requests one at a
time (batch 1), then four at once (batch 4), each phase on prompts of its own,
so no drafter has seen the answer before. Prints tokens/s, the acceptance
length (tokens per model step) and whether every output is identical to
plain decoding's, then one answer.

The model is the tiny copier committed in ``lookahead/testing/tiny_copier``
(``scripts/train_tiny_copier.py`` made it): a 4M-weight Llama that really
copies from its prompt, on code it never saw in training (``copier_tasks.HELD_OUT``).
SGLang's own start-up messages go to a log file (its path is printed).

    python scripts/demo.py [--requests 4] [--num-draft-tokens 8] [--one-branch] [--batches 1 4]
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

from lookahead.testing import TINY_COPIER  # noqa: E402



def requests(tokenizer, n: int, batches) -> tuple[list[str], dict]:
    """(warm-up prompt, {batch: its n prompts}): disjoint held-out rename requests."""
    sys.path.insert(0, str(REPO / "scripts"))
    import copier_tasks

    reqs = [r["prompt"] for r in copier_tasks.held_out_requests(tokenizer, 1 + n * len(batches), seed=1,
                                                                  kinds=("edit",))]
    return reqs[:1], {b: reqs[1 + i * n: 1 + (i + 1) * n] for i, b in enumerate(batches)}


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


def serve(model: str, engine_kwargs: dict, sampling: dict, warmup, phases: dict, log: Path) -> dict:
    import sglang as sgl

    with stderr_to(log):
        engine = sgl.Engine(model_path=model, log_level="error", **engine_kwargs)
    try:
        engine.generate(warmup, {**sampling, "max_new_tokens": 16})  # first-call costs, not measured
        return {b: measure(engine, prompts, sampling, b) for b, prompts in phases.items()}
    finally:
        with stderr_to(log):
            engine.shutdown()


def run(argv=None) -> dict:
    """Serve, measure and print; returns {"runs": {decoding: {batch: figures}},
    "identical": bool, "lookahead": LOOKAHEAD's row name}."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=str(TINY_COPIER), help="default: the tiny copier")
    ap.add_argument("--requests", type=int, default=4, help="requests per phase")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4], help="one phase per batch size")
    ap.add_argument("--max-new-tokens", type=int, default=640)
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="verify width per request (root included)")
    ap.add_argument("--one-branch", action="store_true", help="LOOKAHEAD drafts a chain instead of a tree")
    ap.add_argument("--log", default=None, help="where SGLang's messages go (default: .cache/demo_sglang.log)")
    ap.add_argument("--show", type=int, default=1, help="print this many answers")
    args = ap.parse_args(argv)

    from lookahead.testing.cpu_env import apply_cpu_env, cpu_engine_kwargs, default_cache_dir

    apply_cpu_env()
    from transformers import AutoTokenizer

    model = args.model_path
    log = Path(args.log) if args.log else default_cache_dir() / "demo_sglang.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    warmup, phases = requests(AutoTokenizer.from_pretrained(model), args.requests, args.batches)
    sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
    base = cpu_engine_kwargs(max_total_tokens=32768, max_running_requests=max(args.batches))
    spec = {"speculative_num_draft_tokens": args.num_draft_tokens}
    mode = "chain" if args.one_branch else "tree"
    la_name = f"LOOKAHEAD ({mode})"
    configs = [
        ("plain", base),
        ("NGRAM", {**base, **spec, "speculative_algorithm": "NGRAM"}),
        (la_name, {**base, **spec, "speculative_algorithm": "LOOKAHEAD", "speculative_one_branch": args.one_branch}),
    ]
    print(f"model: {model}")
    print(f"{args.requests} copy-heavy requests per phase, greedy, verify width {args.num_draft_tokens}; "
          f"SGLang's messages: {log}", flush=True)
    results = {}
    for name, kwargs in configs:
        t0 = time.time()
        print(f"  {name}...", end="", flush=True)
        results[name] = serve(model, kwargs, sampling, warmup, phases, log)
        print(f" {time.time() - t0:.0f} s", flush=True)

    plain = results["plain"]
    identical = all(r[b]["outputs"] == plain[b]["outputs"] for r in results.values() for b in phases)
    print()
    print("| batch | decoding | tokens | model steps | AL (tokens/step) | tokens/s | vs plain | identical to plain |")
    print("|---|---|---|---|---|---|---|---|")
    for b in phases:
        for name, r in results.items():
            p = r[b]
            rate = p["tokens"] / p["seconds"]
            ratio = rate / (plain[b]["tokens"] / plain[b]["seconds"])
            print(f"| {b} | {name} | {p['tokens']} | {p['steps']} | {p['tokens'] / p['steps']:.2f} | {rate:.1f} | "
                  f"{ratio:.2f}x | {'yes' if p['outputs'] == plain[b]['outputs'] else 'NO'} |")
    print()
    for b in phases:
        rate = {name: r[b]["tokens"] / r[b]["seconds"] for name, r in results.items()}
        al = {name: r[b]["tokens"] / r[b]["steps"] for name, r in results.items()}
        print(f"batch {b}: LOOKAHEAD {rate[la_name] / rate['plain']:.2f}x plain and "
              f"{rate[la_name] / rate['NGRAM']:.2f}x NGRAM in tokens/s; AL {al[la_name]:.2f} against NGRAM's "
              f"{al['NGRAM']:.2f} ({al[la_name] / al['NGRAM']:.2f}x)")
    print(f"outputs identical to plain decoding: {identical}")
    if not identical:
        for name, r in results.items():
            for b in phases:
                for i, (a, c) in enumerate(zip(plain[b]["outputs"], r[b]["outputs"])):
                    if a != c:
                        at = next((k for k, (x, y) in enumerate(zip(a, c)) if x != y), min(len(a), len(c)))
                        print(f"  {name}, batch {b}, request {i}: differs from token {at}")
    first = next(iter(phases))
    for prompt, text in list(zip(phases[first], plain[first]["texts"]))[: args.show]:
        print(f"\n--- request ---\n{prompt.strip()}\n--- answer ---\n{text}")
    return {"runs": results, "identical": identical, "lookahead": la_name}


def main(argv=None) -> int:
    return 0 if run(argv)["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
