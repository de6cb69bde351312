"""Model-free acceptance replay: "how much would LOOKAHEAD accept on my logs?"

A trace is a log of requests (``lookahead.replay.formats``): token-id JSONL
(``{"prompt": [ids], "response": [ids]}``), SGLang's JSON request logs,
ShareGPT conversations or OpenAI chat logs, the text ones tokenized with
``--tokenizer``. Its requests are served one at a time, in log order, with
every drafter's caches persisting across requests.  At each step a drafter proposes at most
``budget`` tokens after the context (prompt + response so far); the longest
root path that matches the recorded continuation is accepted, plus the
target's own bonus token, and the drafter is then given those tokens.

AL = response tokens / steps, every step counted (sequence-normalised
acceptance length).  Also reported: drafted tokens per step
and the drafter's cost (draft + feeding) in microseconds per step.

    python -m lookahead.replay --trace traces/synth_rag.jsonl.gz --budget 4 8 16
    python -m lookahead.replay --trace sglang_logs/ --tokenizer /models/M --budget 4 8 16

At the end it recommends the ``--speculative-num-draft-tokens`` and mode to
start with, and the speed-up to expect at batch 1 on a GPU under a stated
cost model of the verify step (``--verify-cost``).

What tenant isolation costs on a trace: ``--scope-by FIELD`` replays
LOOKAHEAD with each request in the scope its trace line names (e.g. a
``"tenant"`` field), as a server with ``--speculative-lookahead-isolation
salt`` would; ``--tenants 1 8 64`` splits the requests round-robin into that
many scopes; ``--no-sharing`` is ``--speculative-lookahead-isolation
request``.  The anchors have no isolation and run once, unsplit.

What a fleet costs: ``--replicas 1 2 4 8 16`` deals the requests round robin
to that many replicas, each with its own history (``lookahead.replay.fleet``),
and prints AL as a share of one shared history's; ``--share`` adds the fleet
sharing its history, each finished request reaching the other replicas
``--share-lag`` finished requests later (default 1).

    python -m lookahead.replay --trace T.jsonl.gz --replicas 2 4 8 16 --share
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

import numpy as np

from lookahead.replay import baselines
from lookahead.replay.formats import ReplayTrace, TraceError, read_trace

ALL_DRAFTERS = ("lookahead", "lookahead-1b", "ngram", "prompt-lookup", "suffix", "suffix-path")


@dataclass
class ReplayResult:
    trace: str
    drafter: str
    budget: int
    requests: int
    response_tokens: int
    steps: int
    drafted_tokens: int
    drafter_seconds: float
    split: str = ""  # how the requests were scoped ("": one shared history)

    @property
    def acceptance_length(self) -> float:
        return self.response_tokens / max(self.steps, 1)

    @property
    def drafted_per_step(self) -> float:
        return self.drafted_tokens / max(self.steps, 1)

    @property
    def us_per_step(self) -> float:
        return 1e6 * self.drafter_seconds / max(self.steps, 1)

    def as_dict(self) -> dict:
        return {**asdict(self), "acceptance_length": self.acceptance_length,
                "drafted_per_step": self.drafted_per_step, "us_per_step": self.us_per_step}


def load_trace(path: str, limit: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Read a token-id trace's (prompt, response) pairs into memory as int32 arrays."""
    trace = read_trace(path, limit=limit)
    try:
        return [(p.copy(), r.copy()) for p, r in trace]
    finally:
        trace.close()


def load_scopes(path: str, field: str, limit: int | None = None) -> list:
    """Each request's scope: its line's ``field`` as a string (the default
    scope, None, where the line has no such field or it is null)."""
    trace = read_trace(path, scope_field=field, limit=limit)
    trace.close()
    return trace.scopes


def accepted_length(tokens: list, parents: list, truth: np.ndarray) -> int:
    """Length of the longest root path of the draft that matches ``truth``."""
    if not tokens:
        return 0
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    node, depth, limit = -1, 0, len(truth)
    while depth < limit:
        want = int(truth[depth])
        for child in children.get(node, ()):
            if tokens[child] == want:
                node = child
                depth += 1
                break
        else:
            break
    return depth


def replay(drafter: baselines.ReplayDrafter, pairs: Iterable, budget: int, trace_name: str = "",
           progress: Callable[[int], None] | None = None, scopes: list | None = None,
           split: str = "") -> ReplayResult:
    """``pairs``: the requests' (prompt, response) int32 arrays, in order (a
    list, or a ``ReplayTrace`` read as it goes); ``scopes``: request i's
    scope (``LookaheadDrafter`` only)."""
    steps = drafted = response_tokens = requests = 0
    spent = 0.0
    clock = time.perf_counter
    for rid, (prompt, response) in enumerate(pairs):
        plen, rlen = len(prompt), len(response)
        context = np.concatenate([prompt, response])  # drafters see views of its prefix
        t0 = clock()
        if scopes is None:
            drafter.start(rid, prompt)
        else:
            drafter.start(rid, prompt, scope=scopes[rid])
        spent += clock() - t0
        i = 0
        while i < rlen:
            t0 = clock()
            tokens, parents = drafter.draft(rid, context[: plen + i], budget)[:2]
            spent += clock() - t0
            advance = min(accepted_length(tokens, parents, response[i:]) + 1, rlen - i)
            t0 = clock()
            drafter.accept(rid, context[: plen + i + advance], response[i: i + advance])
            spent += clock() - t0
            drafted += len(tokens)
            steps += 1
            i += advance
        t0 = clock()
        drafter.finish(rid)
        spent += clock() - t0
        response_tokens += rlen
        requests += 1
        if progress is not None:
            progress(rid + 1)
    return ReplayResult(trace_name, drafter.name, budget, requests, response_tokens, steps, drafted, spent, split)


def make_drafter(name: str, budget: int, share: bool = True) -> baselines.ReplayDrafter:
    """``share=False``: LOOKAHEAD requests share no history."""
    if name == "lookahead":
        return baselines.LookaheadDrafter(one_branch=False, share=share)
    if name == "lookahead-1b":
        return baselines.LookaheadDrafter(one_branch=True, share=share)
    if name == "ngram":
        return baselines.NgramDrafter(budget)
    if name == "prompt-lookup":
        return baselines.PromptLookupDrafter()
    if name == "suffix":
        return baselines.SuffixDrafter(path=False)
    if name == "suffix-path":
        return baselines.SuffixDrafter(path=True)
    raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(ALL_DRAFTERS)}")


def available_drafters(names: Iterable[str], log=print) -> list[str]:
    """Drop drafters whose optional dependency is missing, saying so."""
    out = []
    for name in names:
        if name.startswith("suffix") and not baselines.suffix_available():
            log(f"note: {name} skipped: arctic_inference is not installed (optional, its build is heavy)")
            continue
        if name == "ngram":
            try:
                import sglang.srt.speculative.cpp_ngram.ngram_corpus  # noqa: F401
            except Exception as exc:  # sglang is a dependency, but say why if it breaks
                log(f"note: ngram skipped: cannot import SGLang's NgramCorpus ({exc})")
                continue
        out.append(name)
    return out


def markdown_table(results: list[ReplayResult]) -> str:
    """One row per (trace, budget, drafter); LOOKAHEAD rows carry the ratio
    to the best anchor (the best non-lookahead drafter) of that trace and budget."""
    lines = ["| trace | budget | drafter | AL | vs best anchor | drafted/step | µs/step |",
             "|---|---|---|---|---|---|---|"]
    keys = sorted({(r.trace, r.budget) for r in results}, key=lambda k: (k[0], k[1]))
    for trace, budget in keys:
        rows = [r for r in results if r.trace == trace and r.budget == budget]
        anchors = [r for r in rows if not r.drafter.startswith("lookahead")]
        best = max(anchors, key=lambda r: r.acceptance_length) if anchors else None
        chains = [r for r in anchors if r.drafter in ("prompt-lookup", "suffix-path")]
        best_chain = max(chains, key=lambda r: r.acceptance_length) if chains else None
        for r in rows:
            ratio = ""
            ref = best_chain if r.drafter == "lookahead-1b" else best
            if r.drafter.startswith("lookahead") and ref is not None:
                ratio = f"{r.acceptance_length / ref.acceptance_length:.2f}x {ref.drafter}"
            elif best is not None and r is best:
                ratio = "best anchor"
            label = f"{r.drafter} ({r.split})" if r.split else r.drafter
            lines.append(f"| {trace} | {budget} | {label} | {r.acceptance_length:.2f} | {ratio} | "
                         f"{r.drafted_per_step:.2f} | {r.us_per_step:.1f} |")
    return "\n".join(lines)


def isolation_table(results: list[ReplayResult]) -> str:
    """AL per way of scoping the requests, and its change from the first
    (e.g. 1 tenant: one shared history), per trace, budget and drafter."""
    splits = list(dict.fromkeys(r.split for r in results if r.split))
    if not splits:
        return ""
    lines = ["| trace | budget | drafter | " + " | ".join(splits) + " |",
             "|---|---|---|" + "---|" * len(splits)]
    keys = sorted({(r.trace, r.budget, r.drafter) for r in results if r.split})
    for trace, budget, drafter in keys:
        by_split = {r.split: r.acceptance_length for r in results
                    if (r.trace, r.budget, r.drafter) == (trace, budget, drafter) and r.split}
        first = by_split.get(splits[0])
        cells = []
        for split in splits:
            al = by_split.get(split)
            if al is None:
                cells.append("")
            elif split == splits[0] or not first:
                cells.append(f"{al:.3f}")
            else:
                cells.append(f"{al:.3f} ({100 * (al / first - 1):+.1f}%)")
        lines.append(f"| {trace} | {budget} | {drafter} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recommend(results: list[ReplayResult], verify_cost: float) -> str:
    """Per trace: LOOKAHEAD's AL per budget and mode, the speed-up each would
    give at batch 1 if a verify step of ``budget + 1`` tokens costs
    ``1 + verify_cost * budget`` decode steps (drafting, tens of µs, left
    out), and the setting to start with: the best estimated speed-up, the
    smaller budget and the tree on a tie."""
    out = []
    for trace in dict.fromkeys(r.trace for r in results):
        candidates = [r for r in results if r.trace == trace and r.drafter in ("lookahead", "lookahead-1b")]
        if not candidates:
            continue
        # The unscoped replay where there is one; else the requests as the
        # server would scope them (--scope-by), else the first split replayed.
        splits = list(dict.fromkeys(r.split for r in candidates))
        split = "" if "" in splits else next((s for s in splits if s.startswith("by ")), splits[0])
        rows = sorted((r for r in candidates if r.split == split), key=lambda r: (r.budget, r.drafter))

        def speedup(r: ReplayResult) -> float:
            return r.acceptance_length / (1.0 + verify_cost * r.budget)

        best = max(rows, key=speedup)
        out += [f"### {trace}" + (f" ({split})" if split else ""), "",
                "| --speculative-num-draft-tokens | mode | AL | expected speed-up at batch 1 |",
                "|---|---|---|---|"]
        out += [f"| {r.budget + 1} | {'one-branch' if r.drafter == 'lookahead-1b' else 'tree'} | "
                f"{r.acceptance_length:.2f} | {speedup(r):.2f}x |" for r in rows]
        flags = f"--speculative-num-draft-tokens {best.budget + 1}"
        if best.drafter == "lookahead-1b":
            flags += " --speculative-one-branch"
        verdict = (f"Start with `--speculative-algorithm LOOKAHEAD {flags}`: AL {best.acceptance_length:.2f}, "
                   f"about {speedup(best):.2f}x plain decoding at batch 1 on a GPU")
        if speedup(best) < 1.1:
            verdict += " (little to gain: this traffic repeats little that was seen before)"
        out += ["", verdict + ".", ""]
    if out:
        out += [f"Assumed: a verify step of N tokens costs 1 + {verify_cost:g} x (N - 1) decode steps, as on a "
                "GPU where a batch-1 forward is memory-bound (--verify-cost sets it; measure yours with "
                "benchmarks/bench_serving.py). Above --speculative-lookahead-max-batch-size requests decode "
                "one token per step, as plain decoding does."]
    return "\n".join(out)


def plot(results: list[ReplayResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = sorted({r.trace for r in results})
    fig, axes = plt.subplots(1, len(traces), figsize=(4.5 * len(traces), 3.8), squeeze=False)
    for ax, trace in zip(axes[0], traces):
        for name in sorted({r.drafter for r in results if r.trace == trace}):
            rows = sorted((r for r in results if r.trace == trace and r.drafter == name), key=lambda r: r.budget)
            style = "-o" if name.startswith("lookahead") else "--s"
            ax.plot([r.budget for r in rows], [r.acceptance_length for r in rows], style, label=name)
        ax.set_title(trace)
        ax.set_xlabel("draft budget (tokens)")
        ax.set_ylabel("acceptance length")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lookahead.replay", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="append", required=True,
                    help="a log: token-id JSONL, SGLang JSON request logs (a file or the directory), ShareGPT "
                         "or OpenAI chat logs, optionally gzipped; repeat for several")
    ap.add_argument("--tokenizer", metavar="PATH",
                    help="the model's local tokenizer, for logs that hold text (conversations are rendered "
                         "with its chat template)")
    ap.add_argument("--verify-cost", type=float, default=0.01, metavar="C",
                    help="for the recommendation: each verified token beyond the first costs C decode steps "
                         "(default 0.01, a memory-bound batch-1 forward on a GPU)")
    ap.add_argument("--budget", type=int, nargs="+", default=[8], help="draft budgets to replay (default 8)")
    ap.add_argument("--drafters", default=",".join(ALL_DRAFTERS),
                    help=f"comma-separated subset of {', '.join(ALL_DRAFTERS)} (default: all available)")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N requests of each trace")
    ap.add_argument("--out-dir", default="replay_out", help="where the JSON and PNG go (default ./replay_out)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--scope-by", metavar="FIELD",
                    help="LOOKAHEAD with each request in the scope its trace line's FIELD names (e.g. tenant): "
                         "what isolation by that key costs")
    ap.add_argument("--tenants", type=int, nargs="+", metavar="N",
                    help="LOOKAHEAD with the requests split round-robin into N scopes (one run per N)")
    ap.add_argument("--no-sharing", action="store_true",
                    help="LOOKAHEAD with no shared history (--speculative-lookahead-isolation request)")
    ap.add_argument("--corpus", action="append", metavar="PATH",
                    help="also replay LOOKAHEAD with this external corpus loaded (public), as "
                         "--speculative-lookahead-corpus reads it (text needs --tokenizer); repeatable")
    ap.add_argument("--replicas", type=int, nargs="+", metavar="K",
                    help="LOOKAHEAD on a fleet of K replicas (requests dealt round robin, one history each), "
                         "against one shared history; one run per K")
    ap.add_argument("--share", action="store_true",
                    help="with --replicas: also the fleet sharing its history (--speculative-lookahead-share)")
    ap.add_argument("--share-lag", type=int, default=1, metavar="N",
                    help="with --share: a finished request reaches the other replicas N finished requests "
                         "later (default 1)")
    args = ap.parse_args(argv)

    if args.verify_cost < 0:
        ap.error("--verify-cost must be >= 0")
    if any(b < 0 for b in args.budget):
        ap.error("--budget values must be >= 0")
    if args.tenants and any(n < 1 for n in args.tenants):
        ap.error("--tenants values must be >= 1")
    if args.replicas and any(k < 1 for k in args.replicas):
        ap.error("--replicas values must be >= 1")
    if args.share_lag < 0:
        ap.error("--share-lag must be >= 0")
    if (args.share or args.share_lag != 1) and not args.replicas:
        ap.error("--share and --share-lag need --replicas")
    names = [n.strip() for n in args.drafters.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_DRAFTERS]
    if unknown:
        ap.error(f"unknown drafter(s) {unknown}; choose from {', '.join(ALL_DRAFTERS)}")
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    if args.replicas:  # the fleet replays LOOKAHEAD only (tree, unless --drafters names lookahead-1b)
        names = [n for n in names if n.startswith("lookahead")] if args.drafters != ",".join(ALL_DRAFTERS) else []
    else:
        names = available_drafters(names, log=lambda msg: print(msg, flush=True))

    tokenizer = None
    if args.tokenizer:
        try:
            from lookahead.replay.formats import load_tokenizer

            tokenizer = load_tokenizer(args.tokenizer)
        except TraceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    args.corpus_chunks = []
    for path in args.corpus or ():
        from lookahead.trie.corpora import ReadReport, read_corpus

        report = ReadReport()
        encode = None if tokenizer is None else (lambda t: tokenizer.encode(t, add_special_tokens=False))
        try:
            args.corpus_chunks.append((path, read_corpus(path, encode, 2**31 - 1, report)))
        except (OSError, ValueError) as exc:
            print(f"error: corpus {path}: {exc}", file=sys.stderr)
            return 2
        print(f"corpus {path}: {report}", flush=True)
    if args.replicas:
        return _fleet_main(args, names, tokenizer, log)
    results: list[ReplayResult] = []
    scoped = bool(args.scope_by or args.tenants or args.no_sharing)
    for trace_path in args.trace:
        try:
            trace, pairs = _read_named(trace_path, tokenizer, args, log)
        except (TraceError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            results += _replay_trace(pairs, trace, names, args, scoped, log)
        finally:
            pairs.close()

    table = markdown_table(results)
    print(table)
    if scoped:
        print("\nWhat isolation costs (AL, and its change from the first column):\n")
        print(isolation_table(results))
    advice = recommend(results, args.verify_cost)
    if advice:
        print("\n## Recommendation\n\n" + advice)
    os.makedirs(args.out_dir, exist_ok=True)
    json_path = os.path.join(args.out_dir, "replay.json")
    with open(json_path, "w") as f:
        json.dump([r.as_dict() for r in results], f, indent=1)
    print(f"\nwrote {json_path}")
    if not args.no_plot:
        png = os.path.join(args.out_dir, "replay.png")
        try:
            plot(results, png)
            print(f"wrote {png}")
        except ImportError:
            print("(matplotlib is not installed: no plot; pip install matplotlib for one)")
    return 0


def _replay_trace(pairs: ReplayTrace, trace: str, names: list, args, scoped: bool, log) -> list[ReplayResult]:
    """Every budget and drafter (and isolation split) on one trace."""
    results = []
    # (label, each request's scope, whether requests share a history)
    splits = [(f"{n} tenant{'s' if n > 1 else ''}", [f"tenant-{i % n}" for i in range(len(pairs))], True)
              for n in args.tenants or ()]
    if args.scope_by:
        splits.append((f"by {args.scope_by}", pairs.scopes, True))
    if args.no_sharing:
        splits.append(("no sharing", None, False))
    corpora = getattr(args, "corpus_chunks", None) or []
    for budget in args.budget:
        for name in names:
            lookahead = name.startswith("lookahead")
            runs = splits if scoped and lookahead else [("", None, True)]
            if lookahead and corpora:
                # The same runs again with the corpora loaded: what they are worth.
                runs = runs + [((f"{split}, " if split else "") + "corpus", scopes, share)
                               for split, scopes, share in runs]
            for split, scopes, share in runs:
                drafter = make_drafter(name, budget, share)
                if split.endswith("corpus"):
                    for path, chunks in corpora:
                        drafter.cache.add_corpus(path, chunks)
                every = max(1, len(pairs) // 10)
                res = replay(drafter, pairs, budget, trace, scopes=scopes, split=split,
                             progress=lambda k: k % every == 0 and log(f"  {trace} b={budget} {name}: {k}/{len(pairs)}"))
                close = getattr(getattr(drafter, "cache", None), "close", None)
                if close:
                    close()
                label = f"{name} ({split})" if split else name
                log(f"{trace} budget={budget} {label}: AL {res.acceptance_length:.3f} ({res.us_per_step:.1f} µs/step)")
                results.append(res)
    return results


def _read_named(trace_path: str, tokenizer, args, log):
    """A trace's name (its file name up to the first dot) and its requests,
    with their statistics printed."""
    trace = os.path.basename(trace_path.rstrip(os.sep)).split(".")[0]
    pairs = read_trace(trace_path, tokenizer, scope_field=args.scope_by, limit=args.limit, progress=log)
    print(pairs.stats.summary(), flush=True)
    return trace, pairs


def _fleet_main(args, names: list, tokenizer, log) -> int:
    """--replicas: each trace on fleets of each size, against one shared history."""
    from lookahead.replay.fleet import FleetDrafter, fleet_table

    names = [n for n in names if n.startswith("lookahead")] or ["lookahead"]
    rows = []
    for trace_path in args.trace:
        try:
            trace, pairs = _read_named(trace_path, tokenizer, args, log)
        except (TraceError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        scopes = pairs.scopes if args.scope_by else None
        try:
            for budget in args.budget:
                for name in names:
                    def run(k: int, share: bool) -> float:
                        drafter = FleetDrafter(k, share=share, lag=args.share_lag, one_branch=name == "lookahead-1b")
                        try:
                            res = replay(drafter, pairs, budget, trace, scopes=scopes)
                        finally:
                            drafter.close()
                        log(f"{trace} budget={budget} {name} replicas={k}{' shared' if share else ''}: "
                            f"AL {res.acceptance_length:.3f}")
                        return res.acceptance_length

                    one = run(1, False)
                    for k in args.replicas:
                        alone = one if k == 1 else run(k, False)
                        shared = (one if k == 1 else run(k, True)) if args.share else None
                        rows.append({"trace": trace if name == "lookahead" else f"{trace} ({name})",
                                     "budget": budget, "replicas": k, "one": one, "alone": alone,
                                     "shared": shared})
        finally:
            pairs.close()
    print(fleet_table(rows, args.share_lag))
    os.makedirs(args.out_dir, exist_ok=True)
    json_path = os.path.join(args.out_dir, "fleet.json")
    with open(json_path, "w") as f:
        json.dump({"share_lag": args.share_lag, "rows": rows}, f, indent=1)
    print(f"\nwrote {json_path}")
    return 0
