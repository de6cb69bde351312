"""Plain decoding, EAGLE, LOOKAHEAD and LOOKAHEAD + EAGLE side by side (CPU engine).

The replay (``lookahead.replay``) cannot run a draft model, so this runs real
``sgl.Engine``s on the fixtures of ``lookahead.testing.eagle_fixtures``: the
bigram target, its EAGLE-1 head that agrees on 63% of the vocabulary
(``--head exact``: on all of it), and token-id prompts that copy their answer,
hold none of it, or hold parts of it, decoded in batches of one kind each
(``--grouping mixed``: mixing them). For chains (top-k 1) and trees (top-k
2) at the same verify width, it reports per kind of prompt the acceptance
length (committed tokens per verify step, SGLang's ``spec_accept_length``
over the kind's requests), the output tokens/s of the whole run, and the
output tokens per CPU-second the engine's processes used (on a shared
machine, wall time also counts the other jobs' turns; CPU time much less),
then prints a markdown table and writes JSON.

    .venv/bin/python scripts/bench_hybrid.py [--batch 4] [--length 64] [--grouping kind] [--json out.json]

On a GPU, pass ``--model-path`` / ``--draft-model-path`` of a real pair and
``--device cuda``: the prompts are then the texts of ``tests/e2e_driver.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
KINDS = ("copy", "fresh", "mixed")
SHAPES = {
    "chain": dict(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4),
    "tree": dict(speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6),
}


def _configs(head: str, shapes) -> list:
    out = [("plain", "-", {})]
    for shape in shapes:
        eagle = {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": head, **SHAPES[shape]}
        out += [
            ("EAGLE", shape, eagle),
            ("LOOKAHEAD", shape, {"speculative_algorithm": "LOOKAHEAD", "speculative_one_branch": shape == "chain",
                                  "speculative_num_draft_tokens": SHAPES[shape]["speculative_num_draft_tokens"],
                                  "speculative_lookahead_max_batch_size": 64}),
            ("LOOKAHEAD+EAGLE", shape, {**eagle, "speculative_lookahead_hybrid": True}),
        ]
    return out


def _cpu_seconds(procs) -> float:
    """CPU time (user + system, all threads) the engine's processes have used."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _generate(engine, batch: list, sampling: dict) -> list:
    if isinstance(batch[0], list):  # token ids
        return engine.generate(input_ids=batch, sampling_params=sampling)
    return engine.generate(batch, sampling)


def run(args) -> list:
    sys.path.insert(0, str(REPO))
    from lookahead.testing.cpu_env import apply_cpu_env, cpu_engine_kwargs, default_cache_dir

    if args.device == "cpu":
        apply_cpu_env()
    import sglang as sgl

    from lookahead.testing.eagle_fixtures import bigram_prompts, build_fixtures

    if args.model_path:
        target, head = args.model_path, args.draft_model_path
        sys.path.insert(0, str(REPO / "tests"))
        from e2e_driver import prompts as text_prompts

        by_kind = {"text": text_prompts()}
    else:
        paths = build_fixtures(default_cache_dir() / "eagle")
        target, head = paths["target"], paths[args.head]
        by_kind = bigram_prompts(target, length=args.length)
    sampling = {"temperature": 0.0, "max_new_tokens": args.length, "ignore_eos": True}
    lists = [[(kind, p) for p in ps] for kind, ps in by_kind.items()]
    if args.grouping == "mixed":  # the kinds interleaved, so every batch mixes them
        flat = [item for row in itertools.zip_longest(*lists) for item in row if item is not None]
    else:  # batches of one kind each (a batch of copying requests skips EAGLE's draft)
        flat = [item for kind_list in lists for item in kind_list]
    rows = []
    for name, shape, extra in _configs(head, args.shapes):
        base = dict(max_total_tokens=32768, max_running_requests=max(8, args.batch)) if args.device == "cpu" else {}
        kwargs = cpu_engine_kwargs(**base, **extra) if args.device == "cpu" else {**extra, "device": args.device}
        engine = sgl.Engine(model_path=target, log_level="error", **kwargs)
        try:
            _generate(engine, [flat[0][1]], {**sampling, "max_new_tokens": 8})  # warm-up
            per_kind = {k: [0, 0] for k in by_kind}
            procs = psutil.Process().children(recursive=True)  # the scheduler and detokenizer
            cpu0 = _cpu_seconds(procs)
            tokens, t0 = 0, time.perf_counter()
            for start in range(0, len(flat), args.batch):
                group = flat[start:start + args.batch]
                outs = _generate(engine, [p for _, p in group], sampling)
                for (kind, _), out in zip(group, outs):
                    meta = out["meta_info"]
                    per_kind[kind][0] += meta["completion_tokens"]
                    per_kind[kind][1] += meta.get("spec_verify_ct") or meta["completion_tokens"]
                    tokens += meta["completion_tokens"]
            seconds = time.perf_counter() - t0
            cpu = _cpu_seconds(procs) - cpu0
            info = engine.get_server_info()["internal_states"][0].get("lookahead_hybrid")
        finally:
            engine.shutdown()
        row = {"config": name, "shape": shape, "tokens_per_s": tokens / seconds, "seconds": seconds,
               "tokens_per_cpu_s": tokens / cpu, "cpu_seconds": cpu,
               "accept_length": {k: v[0] / v[1] for k, v in per_kind.items()},
               "accept_length_all": sum(v[0] for v in per_kind.values()) / sum(v[1] for v in per_kind.values())}
        if info:
            row["hybrid"] = {k: info[k] for k in ("request_steps", "accept_length", "eagle_skipped_steps",
                                                  "eagle_drafted_steps", "policy")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(rows: list) -> str:
    kinds = list(rows[0]["accept_length"])
    plain = next(r["tokens_per_s"] for r in rows if r["config"] == "plain")
    plain_cpu = next(r["tokens_per_cpu_s"] for r in rows if r["config"] == "plain")
    head = ["config", "shape"] + [f"AL {k}" for k in kinds] + [
        "AL all", "tok/s", "vs plain", "tok per CPU-s", "vs plain", "EAGLE steps skipped"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        skipped = "-"
        if "hybrid" in r:
            h = r["hybrid"]
            total = h["eagle_skipped_steps"] + h["eagle_drafted_steps"]
            skipped = f"{h['eagle_skipped_steps']} / {total}"
        cells = [r["config"], r["shape"]] + [f"{r['accept_length'][k]:.2f}" for k in kinds] + [
            f"{r['accept_length_all']:.2f}", f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s'] / plain:.2f}x",
            f"{r['tokens_per_cpu_s']:.1f}", f"{r['tokens_per_cpu_s'] / plain_cpu:.2f}x", skipped]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="requests per generate call (decode batch size)")
    parser.add_argument("--length", type=int, default=64, help="output tokens per request")
    parser.add_argument("--head", choices=["noisy", "exact"], default="noisy")
    parser.add_argument("--grouping", choices=["kind", "mixed"], default="kind",
                        help="batches of one kind of prompt each, or mixing the kinds")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--model-path")
    parser.add_argument("--draft-model-path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = run(args)
    print()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
