"""Drive ``python -m sglang.bench_serving`` against running servers and read
back what LOOKAHEAD did: the pieces that ``python -m lookahead.validate`` and
``benchmarks/bench_serving.py`` share.

``build_dataset`` writes prompts built from text that installed PyPI packages
ship (sglang's and numpy's sources and README): code edits, questions over
pasted documents and chat, each numbered so that no two are alike.
``run_bench`` runs one concurrency against one server and returns its median
TPOT, output tokens/s and the run's own accept length; ``server_counters``
reads LOOKAHEAD's steps by path and reason from ``/metrics``; ``markdown``
prints the table with ratios to plain decoding.
"""

from __future__ import annotations

import inspect
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path


def log(*args) -> None:
    print(time.strftime("[%H:%M:%S]"), *args, file=sys.stderr, flush=True)


def build_dataset(n: int, seed: int = 0) -> list[dict]:
    """``n`` ShareGPT-format rows, no two prompts alike: chat, code edits and
    questions over documents (each prompt starts with its own request number)."""
    import sglang
    import sglang.srt.sampling.sampling_params as sp_src

    rng = random.Random(seed)
    readme = Path(sglang.__file__).with_name("README.md")
    paragraphs = [p.strip() for p in readme.read_text().split("\n\n") if len(p.strip()) > 120] if readme.exists() else []
    functions = [src for _, obj in inspect.getmembers(sp_src, inspect.isclass)
                 for _, fn in inspect.getmembers(obj, inspect.isfunction)
                 if fn.__module__ == sp_src.__name__ for src in [inspect.getsource(fn)] if 200 < len(src) < 3000]
    try:
        import numpy.lib._function_base_impl as fb  # numpy >= 2
    except ImportError:
        import numpy.lib.function_base as fb
    functions += [src[:3000] for name in ("diff", "gradient", "interp", "select", "piecewise")
                  if hasattr(fb, name) for src in [inspect.getsource(getattr(fb, name))]]
    rows = []
    for i in range(n):
        kind = i % 3
        if kind == 0 and functions:
            code = rng.choice(functions)
            rows.append(("Rename the first argument of this function to `value` and return the whole "
                         "function:\n\n```python\n" + code + "\n```", code))
        elif kind == 1 and paragraphs:
            doc = "\n\n".join(rng.sample(paragraphs, min(3, len(paragraphs))))
            rows.append(("Here is a document:\n\n" + doc + "\n\nQuote the sentence about performance.",
                         doc[:600]))
        else:
            topic = rng.choice(["speculative decoding", "a radix cache", "continuous batching", "tensor parallelism"])
            rows.append((f"Explain {topic} in a few paragraphs.", f"{topic} is " * 40))
    return [{"id": str(i), "conversations": [{"from": "human", "value": f"[request {i}]\n{q}"},
                                             {"from": "gpt", "value": a}]}
            for i, (q, a) in enumerate(rows)]


# LOOKAHEAD's labelled step counters, per run: "path/reason" -> steps, reason -> overlap read-backs.
COUNTERS = ("steps", "overlap_waits")


def run_bench(url: str, model: str, dataset: Path, concurrency: int, num_prompts: int, output_len: int,
              out_file: Path, env: dict, ignore_eos: bool = True, temperature: float = 0.0,
              chat_template: bool = True) -> dict:
    """One ``sglang.bench_serving`` run: its JSON record, with ``accept_length`` and
    ``steps`` (LOOKAHEAD's decode steps by path/reason) for this run alone.

    sglang.bench_serving's own ``accept_length`` is the server's average since it
    started, so on a server that ran other concurrencies before, it blends them in.
    This run's is its generated tokens over its verify calls, from the server's
    counters (SGLang's ``spec_accept_length``, over the run's requests); None
    without ``--enable-metrics`` or speculation.

    ``ignore_eos`` (sglang.bench_serving's default) runs every answer to
    ``output_len``; False lets answers end where the model ends them.
    ``chat_template`` False sends the dataset's prompts as they are (already
    rendered, e.g. multi-turn conversations)."""
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
           "--model", model, "--tokenizer", model, "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
           "--num-prompts", str(num_prompts), "--sharegpt-output-len", str(output_len),
           "--max-concurrency", str(concurrency), "--request-rate", "inf", "--seed", "1",
           "--output-file", str(out_file), "--disable-tqdm", "--temperature", str(temperature)]
    if chat_template:
        cmd.append("--apply-chat-template")
    if not ignore_eos:
        cmd.append("--disable-ignore-eos")
    before = server_counters(url)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_serving failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    rec = json.loads(out_file.read_text().splitlines()[-1])
    after = server_counters(url)
    for counter in COUNTERS:  # this run's own, as differences of the server's totals
        rec[counter] = {k: v - before[counter].get(k, 0) for k, v in after[counter].items()}
    calls = after["verify_calls"] - before["verify_calls"]
    rec["accept_length"] = (after["generated"] - before["generated"]) / calls if calls > 0 else None
    return rec


def server_counters(url: str) -> dict:
    """From the server's /metrics (all zero without ``--enable-metrics``):
    ``steps``, ``sglang:lookahead_steps_total`` by "path/reason";
    ``overlap_waits``, ``sglang:lookahead_overlap_waits_total`` by reason;
    ``generated`` and ``verify_calls``, the tokens and speculative verify calls
    of the requests finished so far."""
    import urllib.error
    import urllib.request

    counters = {"steps": {}, "overlap_waits": {}, "generated": 0.0, "verify_calls": 0.0}
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
            text = r.read().decode()
    except urllib.error.HTTPError:
        return counters
    totals = {"sglang:generation_tokens_total": "generated", "sglang:spec_verify_calls_total": "verify_calls"}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("sglang:lookahead_steps_total", "sglang:lookahead_overlap_waits_total"):
            labels = {k: v.strip('"') for k, v in
                      (part.split("=", 1) for part in line[line.index("{") + 1: line.index("}")].split(","))}
            if name == "sglang:lookahead_steps_total":
                into, key = counters["steps"], f"{labels['path']}/{labels['reason']}"
            else:
                into, key = counters["overlap_waits"], labels["reason"]
            into[key] = into.get(key, 0) + float(line.rsplit(" ", 1)[1])
        elif name in totals:
            counters[totals[name]] += float(line.rsplit(" ", 1)[1])
    return counters


def reference(config: str, device: str):
    """The plain run a configuration is compared with: the same scheduling mode
    (SGLang runs speculative decoding without overlap on CPU, with it on GPUs)."""
    if config == "plain":
        return None
    if config == "plain-sync":
        return "plain"
    return "plain-sync" if device == "cpu" else "plain"


def markdown(results: list[dict], device: str) -> str:
    by_key = {(r["config"], r["concurrency"]): r for r in results}
    lines = ["| config | concurrency | median TPOT (ms) | TPOT ratio | TPOT ratio, paired by round | output tok/s | "
             "tok/s ratio | tok/s vs best of plain and NGRAM | accept length | steps by path/reason |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ref = reference(r["config"], device)
        p = by_key.get((ref, r["concurrency"]))
        tpot_ratio = f"{r['median_tpot_ms'] / p['median_tpot_ms']:.2f}x {ref}" if p else ""
        paired = paired_tpot_ratio(r, p) if p else None
        paired = f"{paired:.2f}x" if paired is not None else ""
        tput_ratio = f"{r['output_throughput'] / p['output_throughput']:.2f}x {ref}" if p else ""
        best = max((q for q in (p, by_key.get(("ngram", r["concurrency"]))) if q is not None),
                   key=lambda q: q["output_throughput"], default=None)
        vs_best = (f"{r['output_throughput'] / best['output_throughput']:.2f}x {best['config']}"
                   if best is not None and r["config"].startswith("lookahead") else "")
        al = f"{r['accept_length']:.2f}" if r.get("accept_length") else "-"
        steps, waits = (", ".join(f"{k} {int(v)}" for k, v in sorted(r.get(counter, {}).items()) if v)
                        for counter in COUNTERS)
        steps += f" (waited for the previous step under overlap: {waits})" if waits else ""
        lines.append(f"| {r['config']} | {r['concurrency']} | {r['median_tpot_ms']:.2f} | {tpot_ratio} | {paired} | "
                     f"{r['output_throughput']:.1f} | {tput_ratio} | {vs_best} | {al} | {steps} |")
    return "\n".join(lines)


def paired_tpot_ratio(row: dict, ref: dict):
    """The median over rounds of each round's TPOT ratio to ``ref``'s: the two
    runs of a round follow each other, so the machine's drift between rounds
    cancels in each ratio, which it does not in a ratio of the two medians."""
    pairs = [a["median_tpot_ms"] / b["median_tpot_ms"]
             for a, b in zip(row.get("rounds", ()), ref.get("rounds", ())) if b["median_tpot_ms"]]
    return statistics.median(pairs) if pairs else None


def plot(results: list[dict], path: Path) -> bool:
    """TPOT against concurrency, one line per configuration; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for config in dict.fromkeys(r["config"] for r in results):
        rows = sorted((r for r in results if r["config"] == config), key=lambda r: r["concurrency"])
        ax.plot([r["concurrency"] for r in rows], [r["median_tpot_ms"] for r in rows], "-o", label=config)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("median TPOT (ms)")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
