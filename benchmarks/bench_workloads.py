"""Plain decoding, SGLang's NGRAM and LOOKAHEAD on a real LLM, workload by workload.

Each decoding serves, in one ``sgl.Engine`` of its own:

1. batch 1: ``edit``, ``qa``, ``chat`` and ``turn2`` requests
   (``real_workloads``, the ``report`` set unless ``--set tuning``), where
   ``turn2`` follows up on the ``chat`` conversations with the first round's
   first decoding's answers (plain decoding's, by default): every decoding of
   every round serves the same second turns.  In bfloat16 each decoding's
   first answers part from the others' at near ties; with its own in the
   history, each would serve second turns of its own;
2. batch 4 (``--again-batch``, 0 skips it): the ``edit`` and ``qa`` requests
   again, four at once (requests answered before: retries, "regenerate").

Decodings (``--configs``): ``plain``; ``NGRAM-W``, SGLang's NGRAM at verify
width W (``NGRAM`` alone: ``--num-draft-tokens``); ``LOOKAHEAD`` (width
``--num-draft-tokens``, CPU width adaptation on) and ``LOOKAHEAD-fixed``
(``--speculative-lookahead-fixed-width``: every speculating step verifies at
the full width, as a GPU's captured graph would; the drafting-only
comparison).  ``LOOKAHEAD-W`` and ``LOOKAHEAD-W-fixed`` set the width.

``--rounds`` rounds (default 3), the engines' order rotated per round
(``rounds``); every round's figures go to ``OUT.rN.json`` beside ``--json``.
It prints, per workload, each decoding's tokens/s and AL as the median over
rounds with [min-max], and LOOKAHEAD's ratios: to the best NGRAM setting for
that workload (best by median tokens/s), to NGRAM at its own width, and,
at fixed width, its AL against NGRAM's at the same width.

Steps are counted alike for every decoding: the prefill is a model step and
produces the first token, so a request's steps are 1 + its decode steps
(``spec_verify_ct`` for speculative decodings, ``len(output_ids) - 1`` for
plain), and plain decoding's AL is exactly 1.

``--temperature T`` (> 0) samples, each request with a fixed
``sampling_seed``; outputs then differ between decodings by design and are
not compared token by token, but AL and tokens/s are reported.

The model is SmolLM2-135M-Instruct (``real_model``, fetched and converted
on first use).

    python benchmarks/bench_workloads.py [--rounds 3] [--requests 3] [--dtype float32] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

import real_workloads  # noqa: E402
import rounds as rounds_mod  # noqa: E402

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


def steps_of(out: dict) -> int:
    """Model steps of one request, the prefill included: 1 + decode steps."""
    n = len(out["output_ids"])
    verify = out["meta_info"].get("spec_verify_ct")
    if verify is None:  # plain decoding: one decode step per token after the first
        return max(1, n)
    return 1 + int(verify) if n else 0


def seeded(sampling: dict, prompts: list[str], offset: int) -> list[dict]:
    """One sampling dict per request; when sampling, each with a seed of its own
    (fixed by the request's place in the run, so every decoding uses the same)."""
    if not sampling.get("temperature"):
        return [sampling] * len(prompts)
    return [{**sampling, "sampling_seed": 1000 + offset + i} for i in range(len(prompts))]


def measure(engine, prompts: list[str], sampling: dict, batch: int, offset: int = 0) -> dict:
    params = seeded(sampling, prompts, offset)
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), batch):
        p = params[i: i + batch]
        outs += engine.generate(prompts[i: i + batch], p if sampling.get("temperature") else p[0])
    seconds = time.perf_counter() - t0
    tokens = sum(len(o["output_ids"]) for o in outs)
    steps = sum(steps_of(o) for o in outs)
    return {"prompts": list(prompts), "outputs": [o["output_ids"] for o in outs], "texts": [o["text"] for o in outs],
            "tokens": tokens, "seconds": seconds, "steps": steps}


def requests(tokenizer, n: int, seed: int, which: str = "report") -> dict:
    """{workload: n conversations} for the first turns (``turn2`` is built per engine)."""
    return {kind: real_workloads.conversations(kind, n, seed, which) for kind in ("edit", "qa", "chat")}


def serve(model: str, engine_kwargs: dict, sampling: dict, convs: dict, tokenizer, log: Path,
          again_batch: int = 4, batch: int = 1, first_answers: list | None = None, which: str = "report") -> dict:
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
        for k, kind in enumerate(("edit", "qa", "chat")):
            out[kind] = measure(engine, [render(c) for c in convs[kind]], sampling, batch, 100 * k)
        answers = first_answers if first_answers is not None else out["chat"]["texts"]
        second = [real_workloads.follow_up(c, a, which=which) for c, a in zip(convs["chat"], answers)]
        out["turn2"] = measure(engine, [render(c) for c in second], sampling, batch, 300)
        if again_batch:
            again = [render(c) for kind in AGAIN for c in convs[kind]]
            out[f"again-b{again_batch}"] = measure(engine, again, sampling, again_batch, 400)
        return out
    finally:
        with stderr_to(log):
            engine.shutdown()


def rate(p: dict) -> float:
    return p["tokens"] / p["seconds"]


def total(r: dict, phases) -> dict:
    return {k: sum(r[p][k] for p in phases) for k in ("tokens", "seconds", "steps")}


CONFIG = re.compile(r"^(plain|NGRAM|LOOKAHEAD)(?:-(\d+))?(-fixed)?$")


def engine_config(name: str, base: dict, width: int, one_branch: bool = False) -> dict:
    """The engine's keyword arguments for a decoding named as in ``--configs``."""
    m = CONFIG.match(name)
    if not m or (m.group(1) == "plain" and (m.group(2) or m.group(3))) or (m.group(1) == "NGRAM" and m.group(3)):
        raise ValueError(f"unknown decoding {name!r}: plain, NGRAM[-W] or LOOKAHEAD[-W][-fixed]")
    algo, w, fixed = m.group(1), int(m.group(2) or width), bool(m.group(3))
    if algo == "plain":
        return dict(base)
    kw = {**base, "speculative_algorithm": algo, "speculative_num_draft_tokens": w}
    if algo == "LOOKAHEAD":
        kw["speculative_one_branch"] = one_branch
        if fixed:
            kw["speculative_lookahead_fixed_width"] = True
    return kw


def width_of(name: str, default: int) -> int:
    m = CONFIG.match(name)
    return int(m.group(2) or default) if m else default


def figures(results: dict, phases: list) -> dict:
    """{phase: {decoding: {"tokens", "seconds", "steps", "rate", "al"}}} of one round."""
    out = {}
    for phase in phases:
        parts = BATCH1 if phase == ALL else [phase]
        out[phase] = {}
        for name, r in results.items():
            t = total(r, parts)
            out[phase][name] = {**t, "rate": t["tokens"] / t["seconds"], "al": t["tokens"] / max(1, t["steps"])}
    return out


ALL = "batch 1, all"


def report(per_round: list, phases: list, width: int, show=print) -> dict:
    """Print the tables of the rounds' median [min-max]; returns the summary."""
    spread, cell = rounds_mod.spread, rounds_mod.cell
    phases = [p for p in phases if p != ALL] + [ALL]
    figs = [figures(res, phases) for res in per_round]
    names = list(per_round[0])
    ngrams = [n for n in names if n.startswith("NGRAM")]
    summary = {"per_phase": {}}
    show("| phase | decoding | tokens | AL | tokens/s | vs plain |")
    show("|---|---|---|---|---|---|")
    for phase in phases:
        for name in names:
            toks = spread(f[phase][name]["tokens"] for f in figs)
            al = spread(f[phase][name]["al"] for f in figs)
            rt = spread(f[phase][name]["rate"] for f in figs)
            vs = (cell(spread(f[phase][name]["rate"] / f[phase]["plain"]["rate"] for f in figs))
                  if "plain" in names else "")
            show(f"| {phase} | {name} | {toks['median']:.0f} | {cell(al, suffix='', bold=False)} | "
                 f"{cell(rt, '{:.1f}', '', bold=False)} | {vs} |")
            summary["per_phase"].setdefault(phase, {})[name] = {"tokens": toks, "al": al, "rate": rt}
    show("")
    if "LOOKAHEAD" in names and ngrams:
        same = f"NGRAM-{width}" if f"NGRAM-{width}" in names else ("NGRAM" if "NGRAM" in names else None)
        show(f"| phase | best NGRAM (by median tokens/s) | LOOKAHEAD / best NGRAM tokens/s | "
             f"LOOKAHEAD / {same or 'NGRAM at its width (not run)'} tokens/s | LOOKAHEAD / plain tokens/s |")
        show("|---|---|---|---|---|")
        summary["vs_best_ngram"], summary["vs_same_width"], summary["best_ngram"] = {}, {}, {}
        for phase in phases:
            best = max(ngrams, key=lambda n: summary["per_phase"][phase][n]["rate"]["median"])
            vb = spread(f[phase]["LOOKAHEAD"]["rate"] / f[phase][best]["rate"] for f in figs)
            vw = spread(f[phase]["LOOKAHEAD"]["rate"] / f[phase][same]["rate"] for f in figs) if same else None
            vp = (spread(f[phase]["LOOKAHEAD"]["rate"] / f[phase]["plain"]["rate"] for f in figs)
                  if "plain" in names else None)
            summary["best_ngram"][phase], summary["vs_best_ngram"][phase] = best, vb
            summary["vs_same_width"][phase] = vw
            show(f"| {phase} | {best} | {cell(vb)} | {cell(vw) if vw else ''} | {cell(vp) if vp else ''} |")
        show("")
    fixed = [n for n in names if n.endswith("-fixed")]
    if fixed:
        lf = fixed[0]
        w = width_of(lf, width)
        anchor = f"NGRAM-{w}" if f"NGRAM-{w}" in names else ("NGRAM" if "NGRAM" in names and w == width else None)
        if anchor:
            show(f"Fixed width {w} (no CPU width adaptation): AL, the drafting-only comparison")
            show("")
            show(f"| phase | {lf} AL | {anchor} AL | AL ratio |")
            show("|---|---|---|---|")
            summary["fixed_al_ratio"] = {}
            for phase in phases:
                a = spread(f[phase][lf]["al"] for f in figs)
                n = spread(f[phase][anchor]["al"] for f in figs)
                ratio = spread(f[phase][lf]["al"] / f[phase][anchor]["al"] for f in figs)
                summary["fixed_al_ratio"][phase] = ratio
                show(f"| {phase} | {cell(a, suffix='', bold=False)} | {cell(n, suffix='', bold=False)} | {cell(ratio)} |")
            show("")
    return summary


def parse(argv=None, **defaults):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct, fetched on first use")
    ap.add_argument("--requests", type=int, default=defaults.get("requests", 3), help="requests per workload")
    ap.add_argument("--set", dest="prompt_set", default=defaults.get("prompt_set", "report"),
                    choices=real_workloads.SETS, help="which prompt pools (real_workloads): report (default) or tuning")
    ap.add_argument("--seed", type=int, default=defaults.get("seed", 0), help="which requests of the set")
    ap.add_argument("--rounds", type=int, default=defaults.get("rounds", 3),
                    help="rounds, the engines' order rotated per round (figures: median [min-max])")
    ap.add_argument("--max-new-tokens", type=int, default=defaults.get("max_new_tokens", 256))
    ap.add_argument("--temperature", type=float, default=defaults.get("temperature", 0.0),
                    help="0: greedy (outputs compared with plain decoding's); > 0: sampled, a fixed seed per request")
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="verify width per request (root included)")
    ap.add_argument("--dtype", default=defaults.get("dtype", "bfloat16"), choices=("bfloat16", "float32"))
    ap.add_argument("--one-branch", action="store_true", help="LOOKAHEAD drafts a chain instead of a tree")
    ap.add_argument("--batch", type=int, default=1, help="batch size of the four workloads (1: one at a time)")
    ap.add_argument("--again-batch", type=int, default=defaults.get("again_batch", 4),
                    help="batch size of the served-before phase (0: skip)")
    ap.add_argument("--configs", default=defaults.get("configs", "plain,NGRAM-4,NGRAM-8,NGRAM-16,LOOKAHEAD,LOOKAHEAD-fixed"),
                    help="decodings: plain, NGRAM[-W], LOOKAHEAD[-W][-fixed]")
    ap.add_argument("--log", default=None, help="where SGLang's messages go (default: .cache/<script>_sglang.log)")
    ap.add_argument("--json", default=None, help="write the figures here (and each round's to OUT.rN.json)")
    ap.add_argument("--trace", default=None,
                    help="write the first decoding's requests, in the order served, as a replay trace (.jsonl.gz)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rounds already written beside --json (OUT.rN.json) and run the rest")
    ap.add_argument("--reprint", default=None, metavar="JSON",
                    help="serve nothing: print the tables of a run saved with --json (or of its OUT.rN.json rounds)")
    args = ap.parse_args(argv)
    for name in args.configs.split(","):
        try:
            engine_config(name, {}, args.num_draft_tokens)
        except ValueError as e:
            ap.error(str(e))
    if args.temperature < 0:
        ap.error("--temperature must be >= 0")
    return args


def run(args, log_name: str = "bench_workloads", show=print) -> dict:
    from cpu_env import apply_cpu_env, cpu_engine_kwargs, default_cache_dir

    apply_cpu_env()
    from transformers import AutoTokenizer

    from real_model import real_model_path

    model = args.model_path or real_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model)
    log = Path(args.log) if args.log else default_cache_dir() / f"{log_name}_sglang.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    convs = requests(tokenizer, args.requests, args.seed, args.prompt_set)
    sampling = {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens}
    base = cpu_engine_kwargs(dtype=args.dtype, max_total_tokens=32768, max_running_requests=max(4, args.again_batch, args.batch))
    wanted = args.configs.split(",")
    configs = {name: engine_config(name, base, args.num_draft_tokens, args.one_branch) for name in wanted}
    greedy = not args.temperature
    show(f"model: {model} ({args.dtype}); {args.prompt_set} set, seed {args.seed}, {args.requests} requests per "
         f"workload, {'greedy' if greedy else f'temperature {args.temperature:g}, a seed per request'}, "
         f"max {args.max_new_tokens} new tokens, verify width {args.num_draft_tokens}; {args.rounds} round(s), "
         f"order rotated; SGLang's messages: {log}", flush=True)
    first = {}  # the first round's first decoding's chat answers: every turn2 follows up on them
    done = []  # rounds kept from an interrupted run (--resume)
    if args.resume and args.json:
        p = Path(args.json)
        files = sorted(p.parent.glob(f"{p.stem}.r*{p.suffix}"), key=lambda f: int(f.stem.rsplit(".r", 1)[1]))
        done = [json.loads(f.read_text())["runs"] for f in files][: args.rounds]
        if done:
            if list(done[0]) != wanted:
                raise SystemExit(f"--resume: the kept rounds served {list(done[0])}, not {wanted}")
            first["answers"] = done[0][wanted[0]]["chat"]["texts"]
            show(f"resuming: {len(done)} round(s) kept from {', '.join(f.name for f in files[:len(done)])}")

    def serve_one(name: str, r: int) -> dict:
        t0 = time.time()
        show(f"  {name}...", end="", flush=True)
        res = serve(model, configs[name], sampling, convs, tokenizer, log, args.again_batch, args.batch,
                    first.get("answers"), args.prompt_set)
        first.setdefault("answers", res["chat"]["texts"])
        show(f" {time.time() - t0:.0f} s", flush=True)
        return res

    per_round = done + rounds_mod.run_rounds(
        wanted, args.rounds - len(done), serve_one, log=lambda m: show(m, flush=True), first=len(done),
        keep=lambda r, res: rounds_mod.write_round(args.json, r, {"round": r, "order": rounds_mod.rotated(wanted, r),
                                                                   "runs": res})) if args.rounds > len(done) else done
    phases = list(per_round[0][wanted[0]].keys())
    summary = report(per_round, phases, args.num_draft_tokens, show)
    identical = None
    if greedy and "plain" in wanted:
        identical = all(res[n][p]["outputs"] == res["plain"][p]["outputs"]
                        for res in per_round for n in wanted for p in phases)
        show(f"\noutputs identical to plain decoding (every round): {identical}"
             + ("" if identical or args.dtype == "float32" else
                " (bfloat16: verify and decode forwards round differently; lookahead/validate/numerics.py "
                "checks every token)"))
    out = {"model": model, "dtype": args.dtype, "set": args.prompt_set, "seed": args.seed,
           "requests": args.requests, "rounds": args.rounds, "temperature": args.temperature,
           "max_new_tokens": args.max_new_tokens, "width": args.num_draft_tokens,
           "identical": identical, "summary": summary, "convs": convs,
           "orders": [rounds_mod.rotated(wanted, r) for r in range(args.rounds)],
           "runs": per_round[0], "per_round": per_round}
    if args.json:
        Path(args.json).write_text(json.dumps(out))
    if args.trace:
        write_trace(args.trace, tokenizer, per_round[0][wanted[0]])
    return out


def write_trace(path: str, tokenizer, run: dict) -> None:
    """The requests of one decoding as ``lookahead.replay`` reads them:
    ``{"prompt": ids, "response": ids}`` per line, in the order served."""
    import gzip

    with gzip.open(path, "wt") as f:
        for phase in run.values():
            for prompt, output in zip(phase["prompts"], phase["outputs"]):
                f.write(json.dumps({"prompt": tokenizer.encode(prompt), "response": output}) + "\n")


def reprint(path: str, width: int, show=print) -> dict:
    """The tables of a saved run: its ``--json`` file, or every ``OUT.rN.json``
    round beside ``OUT.json`` when the run did not finish."""
    p = Path(path)
    if p.exists():
        per_round = json.loads(p.read_text())["per_round"]
    else:
        files = sorted(p.parent.glob(f"{p.stem}.r*{p.suffix}"), key=lambda f: int(f.stem.rsplit(".r", 1)[1]))
        if not files:
            raise SystemExit(f"{path}: no such file, and no rounds beside it")
        per_round = [json.loads(f.read_text())["runs"] for f in files]
        show(f"{len(files)} round(s) from {', '.join(f.name for f in files)}")
    phases = list(per_round[0][next(iter(per_round[0]))].keys())
    return report(per_round, phases, width, show)


if __name__ == "__main__":
    a = parse()
    if a.reprint:
        reprint(a.reprint, a.num_draft_tokens)
    else:
        run(a)
