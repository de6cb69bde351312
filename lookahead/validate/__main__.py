"""Validate LOOKAHEAD on a CUDA machine with SGLang installed: ``python -m lookahead.validate``.

What only a GPU can show, on the user's own model:

1. **The feature matrix** (``lookahead/validate/feature_matrix.py``: structured output,
   logprobs at batch sizes 1, 4 and 6, stops, ``n``, penalties,
   ``min_new_tokens``, long prompts and the radix cache, streaming, abort,
   16 concurrent requests) against plain decoding, for a LOOKAHEAD tree and a
   one-branch chain, both with overlap scheduling and CUDA graphs as a GPU
   server runs by default. The plain reference runs without overlap: plain
   decoding with overlap counts penalties one token late.
2. **Speed**: ``python -m sglang.bench_serving`` at concurrency 1, 4 and 16
   for plain, NGRAM, LOOKAHEAD and LOOKAHEAD with ``--speculative-lookahead-max-batch-size
   auto``, with LOOKAHEAD's steps by path (tier ``verify``/``single``,
   ``graph``/``eager``) and reason from its ``/metrics``, and the steps that
   waited for the previous forward under overlap (only drafting steps may:
   a step that drafts nothing takes its roots on the device).

3. **LOOKAHEAD + EAGLE** (with ``--draft-model-path``, an EAGLE/EAGLE3 head
   for the model): the matrix for EAGLE alone, then for EAGLE with
   ``--speculative-lookahead-hybrid`` as trees (top-k > 1) and as chains
   (top-k 1), with overlap scheduling and CUDA graphs; the hybrid must answer
   as plain decoding wherever EAGLE itself does (penalties and
   ``min_new_tokens`` differ for EAGLE: its penalties are applied once per
   step). What this proves on a GPU and not on CPU: the hybrid's tree mask in
   the FULL_MASK layout of the GPU backends (written into the backend's
   ``verify_mask`` buffer under CUDA graphs), irregular trees at top-k > 1 on
   FlashInfer / FlashAttention-3 / Triton, the overlap relay with trie drafts
   (the previous step's tokens read back for the trie), and skipped EAGLE
   draft steps under CUDA graphs. Then bench_serving for EAGLE and the hybrid
   with the hybrid's steps by draft source and EAGLE steps skipped.

``--configs`` picks the configurations (each checked against its own
plain reference, so two runs with disjoint ``--configs`` can share a GPU
side by side); plain decoding with overlap runs the matrix as a control,
whose differences are shown but not counted (overlap itself changes
penalties). A configuration whose server fails is reported and the next
one still runs.

Prints a report; exits 1 when an answer differs from plain decoding or a
step ran on a path the design does not intend (a fallback step wider than
one token, or eager steps where graphs were captured). A model in bfloat16
or float16 is compared up to near ties (``--numerics``, ``lookahead/validate/numerics.py``):
its kernels round differently between a verify and a decode step, as plain
decoding's do between batch sizes, so an answer may part from plain
decoding's where plain decoding's own two best tokens were that close.

    python -m lookahead.validate --model-path meta-llama/Llama-3.1-8B-Instruct \
        [--draft-model-path yuhuili/EAGLE-LLaMA3.1-Instruct-8B] [--hybrid-only]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from lookahead.validate import feature_matrix as fm
from lookahead.validate import numerics
from lookahead.validate import serving as bench
from lookahead.validate.server import SGLangServer


def log(*args) -> None:
    print(time.strftime("[%H:%M:%S]"), *args, flush=True)


CONFIG_NAMES = ["lookahead", "lookahead-1b", "plain", "ngram", "lookahead-auto"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--num-draft-tokens", type=int, default=8)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompts-per-concurrency", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--extra-server-args", default="", help="appended to every server's flags")
    ap.add_argument("--out-dir", default="artifacts/gpu_check")
    ap.add_argument("--draft-model-path", help="an EAGLE head for --model-path: also check LOOKAHEAD + EAGLE")
    ap.add_argument("--eagle-algorithm", default="EAGLE", choices=["EAGLE", "EAGLE3"])
    ap.add_argument("--hybrid-only", action="store_true", help="skip the LOOKAHEAD-only servers")
    ap.add_argument("--server-timeout", type=float, default=900, help="seconds a server may take to come up")
    ap.add_argument("--configs", nargs="+", choices=CONFIG_NAMES, default=CONFIG_NAMES,
                    help="the configurations to run (default: all); the plain reference starts only if one is compared with it")
    ap.add_argument("--numerics", choices=["auto", "exact", "near-tie"], default="auto",
                    help="exact: every token and logprob (float32) as plain decoding's; near-tie: a token may differ "
                         "where plain decoding's two best were a near tie (16-bit models, see lookahead/validate/numerics.py); "
                         "auto: near-tie for bfloat16/float16 weights")
    ap.add_argument("--logprob-tolerance", type=float, help="near-tie: nats a logprob may move (default by dtype)")
    ap.add_argument("--tie-margin", type=float, help="near-tie: the largest margin a divergence may have (default by dtype)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, env = args.model_path, dict(os.environ)
    base = ["--max-running-requests", "16", "--chunked-prefill-size", "1024", "--enable-custom-logit-processor",
            *args.extra_server_args.split()]
    width = ["--speculative-num-draft-tokens", str(args.num_draft_tokens)]
    graphs = not {"--disable-cuda-graph", "cpu"} & set(base)  # steps off graphs are then intended
    dataset = out / "local_sharegpt.json"
    dataset.write_text(json.dumps(bench.build_dataset(max(8, args.prompts_per_concurrency * max(args.concurrency)))))
    failures, rows = [], []
    tolerances = numerics_mode(args, base)
    log("comparing answers " + ("exactly" if tolerances is None else
                                "up to near ties (logprobs within %.3g nats, ties within %.3g)" % tolerances))

    def run_bench(name, server):
        bench.run_bench(server.url, model, dataset, 2, 4, 16, out / f"warmup_{name}.jsonl", env)
        for c in args.concurrency:
            n = max(8, args.prompts_per_concurrency * c)
            rec = bench.run_bench(server.url, model, dataset, c, n, args.output_len,
                                  out / f"bench_{name}_c{c}.jsonl", env)
            steps = rec["steps"]
            rows.append({"config": name, "concurrency": c, "median_tpot_ms": rec["median_tpot_ms"],
                         "output_throughput": rec["output_throughput"], "accept_length": rec.get("accept_length"),
                         "steps": steps, "overlap_waits": rec["overlap_waits"]})
            log(f"{name} c={c}: TPOT {rec['median_tpot_ms']:.2f} ms, {rec['output_throughput']:.0f} tok/s, "
                f"steps {steps}, waited under overlap {rec['overlap_waits']}")

    def serve(name, flags):
        log(f"starting {name}")
        return SGLangServer(model, base + flags, env, out / f"server_{name}.log").start(timeout=args.server_timeout)

    lookahead = ["--speculative-algorithm", "LOOKAHEAD", "--enable-metrics", *width]
    configs = [  # (name, flags, feature matrix, bench_serving)
        ("lookahead", lookahead, True, True),
        ("lookahead-1b", lookahead + ["--speculative-one-branch"], True, False),
        # The control: plain decoding with overlap scheduling differs from the
        # reference where overlap itself changes answers (penalties).
        ("plain", [], "control", True),
        ("ngram", ["--speculative-algorithm", "NGRAM", *width], False, True),
        ("lookahead-auto", lookahead + ["--speculative-lookahead-max-batch-size", "auto"], False, True),
    ]
    # The plain reference, unless nothing selected is compared with it
    # (bench-only configurations).
    cases = reference = margins = None
    if args.draft_model_path or any(matrix for name, _, matrix, _ in configs if name in args.configs):
        server = serve("plain-sync", ["--disable-overlap-schedule"])
        try:
            cases, reference, margins = fm.reference_with_margins(server.url, model, margins=tolerances is not None)
        finally:
            server.stop()
    compare = Comparer(reference, margins, tolerances)

    if args.draft_model_path:
        failures += hybrid_checks(args, cases, compare, serve, run_bench)
    if args.hybrid_only:
        return report(rows, failures, out, compare=compare)

    def check_matrix(name, server, control=False):
        results = fm.run_matrix(server.url, cases, model)
        for case in fm.COMPARED:
            verdict, diffs = compare(name, case, results[case])
            log(f"{name:13s} {case:28s} {verdict}{' (control: not checked)' if diffs and control else ''}")
            if not control:
                failures.extend(diffs[:3])
        compare.log_deviation(name)
        for check in ("regex_sampled_valid", "radix_cache_hit"):
            if not results[check]:
                failures.append(f"{name}: {check} is false")
        if results["stream"]["text"] != results["stream"]["whole"]:
            failures.append(f"{name}: the stream does not reassemble to the answer")
        if not results["abort"]["healthy"]:
            failures.append(f"{name}: the server stopped serving after an abort")
        if not name.startswith("lookahead"):
            return
        counters = bench.server_counters(server.url)
        steps, waits = counters["steps"], counters["overlap_waits"]
        log(f"{name} matrix steps by path/reason: {steps}; waited under overlap, by reason: {waits}")
        if waited_without_drafts(waits):
            failures.append(f"{name}: steps that drafted nothing waited for the previous forward: {waits}")
        wide_single = {k: v for k, v in steps.items() if k.startswith("verify-") and
                       k.split("/")[1] in ("fallback", "does_not_pay", "too_large", "no_draft")}
        if any(wide_single.values()):
            failures.append(f"{name}: steps that speculated nothing verified more than one token: {steps}")

    for name, flags, matrix, speed in configs:
        if name not in args.configs:
            continue
        # One configuration failing (a server that does not come up, an
        # error mid-run) is reported; the others still run.
        try:
            server = serve(name, flags)
        except Exception as exc:  # noqa: BLE001 - reported, then the next configuration
            failures.append(f"{name}: the server did not come up: {str(exc)[-3000:]}")
            log(failures[-1])
            continue
        try:
            if matrix:
                check_matrix(name, server, control=matrix == "control")
            if speed:
                run_bench(name, server)
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            log(failures[-1])
            log(server.log_tail(4000))
        finally:
            server.stop()

    return report(rows, failures, out, graphs, compare)


def waited_without_drafts(waits: dict) -> dict:
    """The overlap read-backs (by step reason) of steps that drafted nothing:
    under overlap such a step takes its roots on the device, so any is a fault."""
    return {k: v for k, v in waits.items() if v and k in ("fallback", "custom_logit_processor")}


def report(rows, failures, out=Path("artifacts/gpu_check"), graphs=True, compare=None) -> int:
    print()
    print(bench.markdown(rows, "cuda"))
    ties = compare.near_ties if compare is not None else []
    (out / "gpu_check.json").write_text(json.dumps({"bench": rows, "failures": failures, "near_ties": ties}, indent=1))
    for row in rows:
        eager = sum(v for k, v in row["steps"].items() if "-eager/" in k)
        if graphs and row["config"].startswith("lookahead") and eager:
            failures.append(f"{row['config']} c={row['concurrency']}: {eager} eager steps where graphs were captured")
        waited = waited_without_drafts(row.get("overlap_waits", {}))
        if waited:
            failures.append(f"{row['config']} c={row['concurrency']}: steps that drafted nothing waited for the "
                            f"previous forward under overlap: {waited}")
    print()
    if failures:
        print(f"FAILED ({len(failures)}):")
        for f in failures:
            print("  " + f)
        return 1
    if ties:
        print(f"{len(ties)} answers parted from plain decoding's at a near tie, each where plain decoding's "
              "two best tokens were closer than the tie margin (16-bit rounding, lookahead/validate/numerics.py):")
        for where, pos, margin in ties:
            print(f"  {where} at token {pos}, margin {margin:.3f}")
    print("PASSED: every answer identical to plain decoding" + (" up to near ties" if ties else "")
          + ", every step on its intended path")
    return 0


# Cases where EAGLE's own output differs from plain decoding: it applies penalties once per step.
EAGLE_RELAXED = {"frequency_penalty", "presence_penalty", "repetition_penalty", "penalties_combined", "min_new_tokens"}


def model_dtype(model_path: str, server_args: list) -> str:
    """The dtype the servers run the model in: ``--dtype``, else its config's."""
    if "--dtype" in server_args and server_args[server_args.index("--dtype") + 1] != "auto":
        dtype = server_args[server_args.index("--dtype") + 1]
        return {"half": "float16", "float": "float32"}.get(dtype, dtype)  # SGLang's aliases
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else "float32"


def numerics_mode(args, server_args: list):
    """None to compare exactly, else (logprob tolerance, tie margin)."""
    dtype = model_dtype(args.model_path, server_args) if args.numerics != "exact" else "float32"
    if args.numerics == "exact" or (args.numerics == "auto" and dtype not in numerics.HALF_PRECISION):
        return None
    tolerance, tie = numerics.HALF_PRECISION.get(dtype, numerics.HALF_PRECISION["bfloat16"])
    return (args.logprob_tolerance or tolerance, args.tie_margin or tie)


class Comparer:
    """A configuration's answers against plain decoding's, case by case:
    exactly, or up to near ties (``lookahead/validate/numerics.py``)."""

    def __init__(self, reference, margins, tolerances):
        self.reference, self.margins, self.tolerances = reference, margins, tolerances
        self.deviation = 0.0
        self.near_ties = []  # (where, token, margin) of every divergence accepted as a near tie

    def __call__(self, name: str, case: str, results) -> tuple[str, list]:
        """(verdict, differences) of one case."""
        where = f"{name}:{case}"
        if self.tolerances is None:
            diffs = fm.differences(self.reference[case], results, where)
            return ("identical" if not diffs else "DIFFERS"), diffs
        c = numerics.compare(self.reference[case], results, self.margins.get(case), *self.tolerances, where=where)
        self.deviation = max(self.deviation, c.max_logprob_deviation)
        if c.differences:
            return "DIFFERS", c.differences
        if c.near_ties:
            self.near_ties += c.near_ties
            return "near tie " + ", ".join(f"at token {pos} (margin {m:.3f})" for _, pos, m in c.near_ties), []
        return "identical", []

    def log_deviation(self, name: str) -> None:
        if self.tolerances is not None:
            log(f"{name}: largest logprob deviation from plain decoding {self.deviation:.4g} nats")
            self.deviation = 0.0


def hybrid_checks(args, cases, compare, serve, run_bench) -> list:
    """LOOKAHEAD + EAGLE: the matrix where EAGLE answers as plain decoding, then speed."""
    failures = []
    eagle = ["--speculative-algorithm", args.eagle_algorithm, "--speculative-draft-model-path",
             args.draft_model_path, "--enable-metrics"]
    shapes = {"tree": ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                       "--speculative-num-draft-tokens", "8"],
              "chain": ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                        "--speculative-num-draft-tokens", "4"]}
    eagle_ok = {}
    for shape, flags in shapes.items():
        for name, extra in ((f"eagle-{shape}", []), (f"hybrid-{shape}", ["--speculative-lookahead-hybrid"])):
            server = serve(name, eagle + flags + extra)
            try:
                results = fm.run_matrix(server.url, cases, args.model_path)
                for case in fm.COMPARED:
                    verdict, diffs = compare(name, case, results[case])
                    if name.startswith("eagle"):
                        eagle_ok[(shape, case)] = not diffs
                        log(f"{name:13s} {case:28s} {verdict if not diffs else 'differs (EAGLE itself)'}")
                        continue
                    expected_ok = eagle_ok.get((shape, case), case not in EAGLE_RELAXED)
                    log(f"{name:13s} {case:28s} {verdict}"
                        f"{'' if expected_ok or not diffs else ' (EAGLE differs too: not checked)'}")
                    if expected_ok:
                        failures += diffs[:3]
                compare.log_deviation(name)
                if name.startswith("hybrid"):
                    for check in ("regex_sampled_valid", "radix_cache_hit"):
                        if not results[check]:
                            failures.append(f"{name}: {check} is false")
                    if not results["abort"]["healthy"]:
                        failures.append(f"{name}: the server stopped serving after an abort")
                    stats = json.loads(fm.get(server.url + "/get_server_info"))["internal_states"][0]
                    log(f"{name} hybrid stats: {json.dumps(stats.get('lookahead_hybrid'))[:2000]}")
                if shape == "tree":
                    run_bench(name, server)
                    if name.startswith("hybrid"):
                        stats = json.loads(fm.get(server.url + "/get_server_info"))["internal_states"][0]
                        log(f"{name} after bench_serving: {json.dumps(stats.get('lookahead_hybrid'))[:2000]}")
            finally:
                server.stop()
    return failures


if __name__ == "__main__":
    sys.exit(main())
