"""Plain decoding, EAGLE, LOOKAHEAD and LOOKAHEAD + EAGLE side by side (CPU engine).

The replay (``lookahead.replay``) cannot run a draft model, so this runs real
SGLang servers (``launch_server``) on the fixtures of ``eagle_fixtures``: the
bigram target, its EAGLE-1 head that agrees on 63% of the vocabulary
(``--head exact``: on all of it), and token-id prompts that copy their answer,
hold none of it, or hold parts of it, decoded in batches of one kind each
(``--grouping mixed``: mixing them). For chains (top-k 1) and trees (top-k
2) at the same verify width, it reports per kind of prompt the acceptance
length (committed tokens per verify step, SGLang's ``spec_accept_length``
over the kind's requests), the output tokens/s of the whole run, and the
output tokens per CPU-second the engine's processes used. The engines of one
shape and a plain one run side by side and take turns, ``--rounds`` runs of
the prompt set each, so the load of a shared machine drifts over all of
them alike; the figures are medians over the rounds, and "vs plain" is the
median of each round's ratio to plain decoding's run in the same round.
Every run has its own ``cache_salt``: no run drafts from (or prefills from)
another's text. The hybrid's counters (steps skipped) cover all rounds. On
CPU the servers run with ``TORCHDYNAMO_DISABLE=1``: EAGLE's draft loop has
``torch.compile``'d helpers whose C++ compilation for each new shape would
otherwise land in the timed runs.

    .venv/bin/python benchmarks/bench_hybrid.py [--batch 4] [--length 64] [--grouping kind] [--json out.json]

On a GPU, pass ``--model-path`` / ``--draft-model-path`` of a real pair and
``--device cuda``: the prompts are then the texts of ``tests/support/e2e_driver.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import urllib.request
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


def _post(url: str, payload: dict):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.loads(r.read())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


def _generate(url: str, batch: list, sampling: dict, salt: str = None) -> list:
    """One ``/generate`` call for the batch (decoded together)."""
    key = "input_ids" if isinstance(batch[0], list) else "text"
    payload = {key: batch, "sampling_params": sampling}
    if salt:
        payload["cache_salt"] = [salt] * len(batch)
    out = _post(url + "/generate", payload)
    return out if isinstance(out, list) else [out]


def run(args) -> list:
    sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "tests" / "support")]
    from cpu_env import cpu_env, cpu_server_args, default_cache_dir
    from eagle_fixtures import bigram_prompts, build_fixtures
    from lookahead.validate.server import SGLangServer

    if args.model_path:
        from e2e_driver import prompts as text_prompts

        target, head = args.model_path, args.draft_model_path
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
    env = cpu_env() if args.device == "cpu" else dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if args.device == "cpu":
        # SGLang's EAGLE draft loop has torch.compile'd helpers; on CPU each new
        # shape compiles C++ for seconds, in the middle of a timed run. Eager
        # everywhere, for every config alike.
        env["TORCHDYNAMO_DISABLE"] = "1"
    out_dir = Path(args.log_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def start(name, extra):
        flags = dict(max_total_tokens=32768, max_running_requests=max(8, args.batch), **extra)
        server_args = cpu_server_args(**flags) if args.device == "cpu" else _flags(flags)
        server = SGLangServer(target, server_args, env, out_dir / f"{name}.log").start(timeout=900)
        for i in range(0, len(flat), args.batch):  # warm-up: every batch shape once
            _generate(server.url, [p for _, p in flat[i:i + args.batch]], {**sampling, "max_new_tokens": 8}, "warm-up")
        return server

    def measure(server, salt):
        procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        per_kind = {k: [0, 0] for k in by_kind}
        cpu0, tokens, t0 = _cpu_seconds(procs), 0, time.perf_counter()
        for i in range(0, len(flat), args.batch):
            group = flat[i:i + args.batch]
            # A salt per run: no run drafts from (or prefills from) another's text.
            for (kind, _), out in zip(group, _generate(server.url, [p for _, p in group], sampling, salt)):
                meta = out["meta_info"]
                per_kind[kind][0] += meta["completion_tokens"]
                per_kind[kind][1] += meta.get("spec_verify_ct") or meta["completion_tokens"]
                tokens += meta["completion_tokens"]
        return {"seconds": time.perf_counter() - t0, "cpu": _cpu_seconds(procs) - cpu0, "tokens": tokens,
                "per_kind": per_kind}

    rows = []
    configs = _configs(head, args.shapes)
    plain = start("plain", configs[0][2])
    try:
        for shape in args.shapes:
            servers = {}
            try:
                for name, sh, extra in configs:
                    if sh == shape:
                        servers[name] = start(f"{name}-{shape}", extra)
                runs = {name: [] for name in ["plain", *servers]}
                for r in range(args.rounds):
                    # Interleaved: every round runs every server once, so the
                    # machine's load drifts over all configs alike.
                    for name, server in [("plain", plain), *servers.items()]:
                        runs[name].append(measure(server, f"{shape}-{r}-{name}"))
                infos = {name: json.loads(_get(server.url + "/get_server_info"))["internal_states"][0]
                         .get("lookahead_hybrid") for name, server in servers.items()}
            finally:
                for server in servers.values():
                    server.stop()
            for name in runs:  # plain decoding's row per shape: its rounds ran beside that shape's servers
                rows.append(_row(name, shape, runs[name], runs["plain"], infos.get(name)))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        plain.stop()
    return rows


def _flags(flags: dict) -> list:
    out = []
    for key, value in flags.items():
        if value is True:
            out.append("--" + key.replace("_", "-"))
        elif value not in (False, None):
            out += ["--" + key.replace("_", "-"), str(value)]
    return out


def _median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])


def _row(name: str, shape: str, runs: list, plain_runs: list, info) -> dict:
    """Medians over the interleaved rounds; speed-ups against plain decoding's
    run of the same round."""
    per_kind = runs[0]["per_kind"]  # greedy: every round commits the same tokens in the same steps
    row = {"config": name, "shape": shape,
           "tokens_per_s": _median([r["tokens"] / r["seconds"] for r in runs]),
           "tokens_per_cpu_s": _median([r["tokens"] / r["cpu"] for r in runs if r["cpu"] > 0]),
           "vs_plain": _median([p["seconds"] / r["seconds"] for r, p in zip(runs, plain_runs)]),
           "cpu_vs_plain": _median([p["cpu"] / r["cpu"] for r, p in zip(runs, plain_runs) if r["cpu"] > 0]),
           "rounds": [{"seconds": round(r["seconds"], 3), "cpu": round(r["cpu"], 3)} for r in runs],
           "accept_length": {k: v[0] / v[1] for k, v in per_kind.items()},
           "accept_length_all": sum(v[0] for v in per_kind.values()) / sum(v[1] for v in per_kind.values())}
    if info:
        row["hybrid"] = {k: info[k] for k in ("request_steps", "accept_length", "eagle_skipped_steps",
                                              "eagle_drafted_steps", "eagle_passthrough_steps",
                                              "trie_draft_us_per_call", "hybrid_host_us_per_step", "policy")}
    return row


def table(rows: list) -> str:
    kinds = list(rows[0]["accept_length"])
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
            f"{r['accept_length_all']:.2f}", f"{r['tokens_per_s']:.1f}", f"{r['vs_plain']:.2f}x",
            f"{r['tokens_per_cpu_s']:.1f}", f"{r['cpu_vs_plain']:.2f}x", skipped]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="requests per generate call (decode batch size)")
    parser.add_argument("--length", type=int, default=64, help="output tokens per request")
    parser.add_argument("--head", choices=["noisy", "exact"], default="noisy")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of the prompt set per engine")
    parser.add_argument("--grouping", choices=["kind", "mixed"], default="kind",
                        help="batches of one kind of prompt each, or mixing the kinds")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--model-path")
    parser.add_argument("--draft-model-path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--log-dir", default="artifacts/bench_hybrid", help="the servers' logs")
    args = parser.parse_args(argv)
    rows = run(args)
    print()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
