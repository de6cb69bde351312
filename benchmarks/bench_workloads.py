"""Plain decoding, SGLang's NGRAM and LOOKAHEAD on a real LLM, workload by workload.

Each decoding serves, in one ``sgl.Engine`` and in this order:

1. batch 1: ``edit``, ``qa``, ``chat`` and ``turn2`` requests
   (``real_workloads``), where ``turn2`` follows up on the ``chat``
   conversations with the first decoding's answers (plain decoding's, by
   default): every decoding serves the same second turns.  In bfloat16 each
   decoding's first answers part from the others' at near ties; with its own
   in the history, each would serve second turns of its own, and the
   comparison would mostly measure how much those happen to repeat;
2. batch 4: the ``edit`` and ``qa`` requests again, four at once (requests
   answered before: retries, "regenerate").

It prints, per workload and decoding, tokens/s, the acceptance length (AL,
tokens per model step) and whether the outputs are identical to plain
decoding's, then LOOKAHEAD's ratios to NGRAM and to plain.  In bfloat16 the
outputs may part at near ties (see the README's note on numerics), so each
decoding's token counts can differ slightly; tokens/s stays comparable.

The model is SmolLM2-135M-Instruct (``real_model``,
fetched and converted on first use).  One round: the VM drifts, so compare
figures within one run only.

    python benchmarks/bench_workloads.py [--requests 3] [--dtype float32] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

import real_workloads  # noqa: E402

BATCH1 = ("edit", "qa", "chat", "turn2")
AGAIN = ("edit", "qa")  # served again at batch 4


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
    return {"prompts": list(prompts), "outputs": [o["output_ids"] for o in outs], "texts": [o["text"] for o in outs],
            "tokens": tokens, "seconds": seconds, "steps": steps}


def requests(tokenizer, n: int, seed: int) -> dict:
    """{workload: n conversations} for the first turns (``turn2`` is built per engine)."""
    return {kind: real_workloads.conversations(kind, n, seed) for kind in ("edit", "qa", "chat")}


def serve(model: str, engine_kwargs: dict, sampling: dict, convs: dict, tokenizer, log: Path,
          again_batch: int = 4, batch: int = 1, first_answers: list | None = None) -> dict:
    """One engine through the phases; {phase name: figures}.  ``turn2``
    follows up on ``first_answers`` (the ``chat`` answers of the decoding
    served first), or on this engine's own."""
    import sglang as sgl

    render = lambda conv: real_workloads.render(tokenizer, conv)  # noqa: E731
    with stderr_to(log):
        engine = sgl.Engine(model_path=model, log_level="error", **engine_kwargs)
    try:
        # First-call costs (and the NGRAM corpus' first build), not measured; an
        # unrelated prompt, so no drafter sees the requests before they are served.
        engine.generate(render([{"role": "user", "content": "Say hello."}]), {**sampling, "max_new_tokens": 8})
        out = {}
        for kind in ("edit", "qa", "chat"):
            out[kind] = measure(engine, [render(c) for c in convs[kind]], sampling, batch)
        answers = first_answers if first_answers is not None else out["chat"]["texts"]
        second = [real_workloads.follow_up(c, a) for c, a in zip(convs["chat"], answers)]
        out["turn2"] = measure(engine, [render(c) for c in second], sampling, batch)
        if again_batch:
            again = [render(c) for kind in AGAIN for c in convs[kind]]
            out[f"again-b{again_batch}"] = measure(engine, again, sampling, again_batch)
        return out
    finally:
        with stderr_to(log):
            engine.shutdown()


def rate(p: dict) -> float:
    return p["tokens"] / p["seconds"]


def total(r: dict, phases) -> dict:
    return {k: sum(r[p][k] for p in phases) for k in ("tokens", "seconds", "steps")}


def report(results: dict, phases: list, la: str) -> dict:
    """Print the table and the ratios; returns the ratios."""
    plain = results["plain"]
    print("| phase | decoding | tokens | model steps | AL | tokens/s | vs plain | identical to plain |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for phase in phases + ["batch 1, all"]:
        parts = BATCH1 if phase == "batch 1, all" else [phase]
        fig = {name: total(r, parts) for name, r in results.items()}  # this phase's figures per decoding
        for name, r in results.items():
            p = fig[name]
            same = all(r[q]["outputs"] == plain[q]["outputs"] for q in parts)
            print(f"| {phase} | {name} | {p['tokens']} | {p['steps']} | {p['tokens'] / p['steps']:.2f} | "
                  f"{rate(p):.1f} | {rate(p) / rate(fig['plain']):.2f}x | {'yes' if same else 'no'} |")
        lp, npp = fig[la], fig["NGRAM"]
        summary[phase] = {"vs_ngram": rate(lp) / rate(npp), "vs_plain": rate(lp) / rate(fig["plain"]),
                          "al": lp["tokens"] / lp["steps"], "al_ngram": npp["tokens"] / npp["steps"]}
    print()
    print("| phase | LOOKAHEAD / NGRAM tokens/s | LOOKAHEAD / plain tokens/s | AL LOOKAHEAD / NGRAM |")
    print("|---|---|---|---|")
    for phase, s in summary.items():
        print(f"| {phase} | {s['vs_ngram']:.2f}x | {s['vs_plain']:.2f}x | {s['al']:.2f} / {s['al_ngram']:.2f} |")
    return summary


def parse(argv=None, **defaults):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct, fetched on first use")
    ap.add_argument("--requests", type=int, default=defaults.get("requests", 3), help="requests per workload")
    ap.add_argument("--seed", type=int, default=defaults.get("seed", 0), help="which requests (real_workloads)")
    ap.add_argument("--max-new-tokens", type=int, default=defaults.get("max_new_tokens", 256))
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="verify width per request (root included)")
    ap.add_argument("--dtype", default=defaults.get("dtype", "bfloat16"), choices=("bfloat16", "float32"))
    ap.add_argument("--one-branch", action="store_true", help="LOOKAHEAD drafts a chain instead of a tree")
    ap.add_argument("--batch", type=int, default=1, help="batch size of the four workloads (1: one at a time)")
    ap.add_argument("--again-batch", type=int, default=4, help="batch size of the served-before phase (0: skip)")
    ap.add_argument("--configs", default="plain,NGRAM,LOOKAHEAD")
    ap.add_argument("--log", default=None, help="where SGLang's messages go (default: .cache/<script>_sglang.log)")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--trace", default=None,
                    help="write the first decoding's requests, in the order served, as a replay trace (.jsonl.gz)")
    return ap.parse_args(argv)


def run(args, log_name: str = "bench_workloads") -> dict:
    from cpu_env import apply_cpu_env, cpu_engine_kwargs, default_cache_dir

    apply_cpu_env()
    from transformers import AutoTokenizer

    from real_model import real_model_path

    model = args.model_path or real_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model)
    log = Path(args.log) if args.log else default_cache_dir() / f"{log_name}_sglang.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    convs = requests(tokenizer, args.requests, args.seed)
    sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
    base = cpu_engine_kwargs(dtype=args.dtype, max_total_tokens=32768, max_running_requests=max(4, args.again_batch, args.batch))
    spec = {"speculative_num_draft_tokens": args.num_draft_tokens}
    configs = {
        "plain": base,
        "NGRAM": {**base, **spec, "speculative_algorithm": "NGRAM"},
        "LOOKAHEAD": {**base, **spec, "speculative_algorithm": "LOOKAHEAD",
                      "speculative_one_branch": args.one_branch},
    }
    wanted = args.configs.split(",")
    print(f"model: {model} ({args.dtype}); {args.requests} requests per workload, greedy, "
          f"max {args.max_new_tokens} new tokens, verify width {args.num_draft_tokens}; one round; "
          f"SGLang's messages: {log}", flush=True)
    results = {}
    for name in wanted:
        t0 = time.time()
        print(f"  {name}...", end="", flush=True)
        first = results[wanted[0]]["chat"]["texts"] if results else None
        results[name] = serve(model, configs[name], sampling, convs, tokenizer, log, args.again_batch, args.batch,
                              first)
        print(f" {time.time() - t0:.0f} s", flush=True)
    phases = list(next(iter(results.values())).keys())
    summary = report(results, phases, "LOOKAHEAD") if {"plain", "NGRAM", "LOOKAHEAD"} <= set(results) else {}
    identical = all(r[p]["outputs"] == results["plain"][p]["outputs"] for r in results.values() for p in phases)
    print(f"\noutputs identical to plain decoding: {identical}"
          + ("" if identical or args.dtype == "float32" else
             " (bfloat16: verify and decode forwards round differently; lookahead/validate/numerics.py checks each parting)"))
    out = {"model": model, "dtype": args.dtype, "requests": args.requests, "identical": identical,
           "summary": summary, "convs": convs,
           "runs": {n: {p: {k: v for k, v in f.items()} for p, f in r.items()} for n, r in results.items()}}
    if args.json:
        Path(args.json).write_text(json.dumps(out))
    if args.trace:
        write_trace(args.trace, tokenizer, results[wanted[0]])
    return out


def write_trace(path: str, tokenizer, run: dict) -> None:
    """The requests of one decoding as ``lookahead.replay`` reads them:
    ``{"prompt": ids, "response": ids}`` per line, in the order served."""
    import gzip

    with gzip.open(path, "wt") as f:
        for phase in run.values():
            for prompt, output in zip(phase["prompts"], phase["outputs"]):
                f.write(json.dumps({"prompt": tokenizer.encode(prompt), "response": output}) + "\n")


if __name__ == "__main__":
    run(parse())
