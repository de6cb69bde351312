#!/usr/bin/env python
"""Drafter overhead: LOOKAHEAD's trie against SGLang's NGRAM, in one run.

Measured on real token ids from recorded replay traces (``--traces-dir DIR``):

* inserting a 2k- and a 32k-token prompt: for LOOKAHEAD the time
  ``put_prompt`` holds the caller's thread, and the time until
  ``synchronize()`` returns (indexing complete, done on the inserter thread);
  for NGRAM ``batch_put`` of the prompt, then ``synchronize()``;
* one decode step at batch 1 and batch 4 (p50, p99), over a warm shared
  history of at least 1M real tokens, with 4k-token contexts: each request
  gets its 1-3 newly accepted tokens and a draft.  LOOKAHEAD: ``put_output``
  per request, then ``draft`` (batch 1) or ``batch_draft`` (batch 4).  NGRAM,
  as ``ngram_worker.py`` drives it: ``batch_put`` of the tails (last 18
  tokens), ``synchronize``, ``batch_get``.  How many tokens each request
  accepts is drawn before the step's clock starts;
* the same batch-4 step while a 32k-token prompt is being indexed in the
  background (the steps issued from the start of the insert until it is
  complete; NGRAM's first step waits in ``synchronize`` for the insert);
* memory per indexed token: LOOKAHEAD ``stats()["total_bytes"]`` / tokens
  held; NGRAM the growth of the process RSS / tokens inserted;
* LOOKAHEAD's decode step with a 10M-token external corpus loaded,
  in rounds: each round measures the batch-4 and batch-1 step without a
  corpus, with the corpus added (requests of the warm history's scope), and
  with the corpus alone (requests that share nothing: no history, as for a
  tenant whose scope is new), then removes the corpus.  The corpus is random
  token ids, so it matches next to nothing: what it costs, not what it
  drafts.

The targets are the project's overhead goals (and the corpus' own).  Usage::

    python benchmarks/bench_trie.py            # full run, a few minutes
    python benchmarks/bench_trie.py --quick    # smoke run
    python benchmarks/bench_trie.py --json bench.json
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]
# SGLang's NGRAM compiles its C++ on first use (about 20 s); reuse the build.
os.environ.setdefault("SGLANG_JIT_CACHE_DIR", str(REPO / ".cache" / "sglang_jit"))

from lookahead.trie.cache import LookaheadCache  # noqa: E402
from lookahead.replay import load_trace  # noqa: E402

NGRAM_DEPTH = 18  # SGLang's server defaults for NGRAM
NGRAM_MIN_BFS, NGRAM_MAX_BFS, NGRAM_CAPACITY = 1, 10, 10_000_000
CONTEXT_TOKENS = 4096

# The overhead targets, for the LOOKAHEAD column.
TARGETS = {
    "step4_p50": ("<=", 60.0, "≤ 60 µs"),
    "step4_p99": ("<=", 150.0, "≤ 150 µs"),
    "step4_insert_p99": ("<=", 200.0, "≤ 200 µs"),
    "index32k_done": ("<=", 20.0, "≤ 20 ms, off-thread"),
    "bytes_per_token": ("<=", 64.0, "≤ 64 B"),
}
CORPUS_VOCAB = 151_669  # the traces' vocabulary (Qwen3): the corpus draws its random ids from it


def rss_bytes() -> int:
    """Resident set size, after handing freed heap memory back to the OS
    (otherwise glibc's retention of freed request stores and temporary lists
    would count as growth)."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(samples, q) -> float:
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q)) if len(samples) else float("nan")


# ---------------------------------------------------------------------------
# Real tokens
# ---------------------------------------------------------------------------


@dataclass
class Tokens:
    warm: list  # streams (prompt + response) fed as history
    pool: np.ndarray  # everything else, concatenated: contexts and prompts are cut from it
    offset: int = 0

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` pool tokens (wrapping around), as a fresh int32 array."""
        if self.offset + n > len(self.pool):
            self.offset = 0
        out = np.array(self.pool[self.offset: self.offset + n], dtype=np.int32)
        self.offset += n
        return out


def load_tokens(traces_dir: str, warm_tokens: int, limit: int | None, seed: int) -> Tokens:
    files = sorted(glob.glob(os.path.join(traces_dir, "*.jsonl.gz")) + glob.glob(os.path.join(traces_dir, "*.jsonl")))
    if not files:
        raise SystemExit(f"no traces (*.jsonl.gz) in {traces_dir}; pass --traces-dir")
    streams = []
    for path in files:
        for prompt, response in load_trace(path, limit):
            streams.append(np.concatenate([prompt, response]).astype(np.int32))
    random.Random(seed).shuffle(streams)  # mix the traces
    warm, held, i = [], 0, 0
    while i < len(streams) and held < warm_tokens:
        warm.append(streams[i])
        held += len(streams[i])
        i += 1
    rest = streams[i:]
    if sum(len(s) for s in rest) < 4 * 32768:
        raise SystemExit(f"the traces in {traces_dir} hold too few tokens beyond the {warm_tokens} warm ones")
    return Tokens(warm, np.concatenate(rest))


# ---------------------------------------------------------------------------
# The two drafters behind one step interface
# ---------------------------------------------------------------------------


@dataclass
class Request:
    rid: str
    stream: np.ndarray  # context (4k) + continuation
    pos: int = CONTEXT_TOKENS  # tokens accepted so far
    rng: random.Random = field(default_factory=random.Random)
    accepted: int = 0  # tokens the next step accepts

    def draw(self) -> None:
        """Outside the timed region: how many tokens the next step accepts
        (the random module's cost is the benchmark's, not a drafter's)."""
        self.accepted = self.rng.randint(1, 3)

    def advance(self) -> int:
        n = self.accepted
        self.pos += n
        return n


class LookaheadSide:
    name = "LOOKAHEAD"

    def __init__(self, budget: int, memory_bytes: int, corpus_memory_bytes: int = 512 << 20):
        gc.collect()
        self.rss_before = rss_bytes()
        self.budget = budget
        self.cache = LookaheadCache(max_memory_bytes=memory_bytes, corpus_memory_bytes=corpus_memory_bytes)
        self.warm_tokens = 0
        self.share = True  # False: requests share nothing (no history; public corpora only)

    def warm(self, streams) -> None:
        for i, s in enumerate(streams):
            rid = f"warm-{i}"
            self.cache.put_prompt(rid, s[:8])
            self.cache.put_output(rid, s[8:])
            self.cache.finish(rid)
            self.warm_tokens += len(s)
        self.cache.synchronize()

    def start(self, req: Request) -> None:
        self.cache.put_prompt(req.rid, req.stream[: req.pos], share=self.share)
        self.cache.synchronize()  # a server drafts after prefill, long after the prompt is indexed

    def stop(self, req: Request) -> None:
        self.cache.finish(req.rid)

    def step(self, reqs) -> None:
        cache = self.cache
        for r in reqs:
            start = r.pos
            n = r.advance()
            cache.put_output(r.rid, r.stream[start: start + n])
        if len(reqs) == 1:
            r = reqs[0]
            cache.draft(r.rid, r.stream[: r.pos], self.budget)
        else:
            cache.batch_draft([r.rid for r in reqs], [r.stream[: r.pos] for r in reqs], self.budget)

    def insert(self, rid: str, prompt: np.ndarray):
        """Start indexing ``prompt``; returns a callable telling whether it is done."""
        self.cache.put_prompt(rid, prompt)
        return lambda: self.cache.stats()["pending_inserts"] == 0

    def insert_done(self, rid: str) -> None:
        self.cache.synchronize()
        self.cache.finish(rid)

    def prompt_insert(self, rid: str, prompt: np.ndarray) -> tuple[float, float]:
        t0 = time.perf_counter()
        self.cache.put_prompt(rid, prompt)
        t1 = time.perf_counter()
        self.cache.synchronize()
        t2 = time.perf_counter()
        self.cache.finish(rid)
        return t1 - t0, t2 - t0

    def bytes_per_token(self) -> float:
        s = self.cache.stats()
        return s["total_bytes"] / max(1, s["shared_tokens"] + s["local_tokens"])

    def close(self) -> None:
        self.cache.close()


class NgramSide:
    name = "NGRAM"

    def __init__(self, budget: int):
        from sglang.kernels.ops.speculative.ngram_corpus import get_ngram_corpus_cls
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        get_ngram_corpus_cls()  # load (or build) the extension before measuring memory
        gc.collect()
        self.rss_before = rss_bytes()
        self.budget = budget
        self.corpus = NgramCorpus(max_trie_depth=NGRAM_DEPTH, min_bfs_breadth=NGRAM_MIN_BFS,
                                  max_bfs_breadth=NGRAM_MAX_BFS, draft_token_num=budget + 1,
                                  match_type="BFS", capacity=NGRAM_CAPACITY)
        self.warm_tokens = 0

    def warm(self, streams, chunk: int = 4096, per_call: int = 16) -> None:
        pieces = [s[i: i + chunk] for s in streams for i in range(0, len(s), chunk)]
        for i in range(0, len(pieces), per_call):
            self.corpus.batch_put([p.tolist() for p in pieces[i: i + per_call]])
        self.corpus.synchronize()
        self.warm_tokens += sum(len(s) for s in streams)

    def start(self, req: Request) -> None:
        pass  # ngram_worker.py does not index prompts

    def stop(self, req: Request) -> None:
        self.corpus.erase_match_state([req.rid])

    def step(self, reqs) -> None:
        for r in reqs:
            r.advance()
        tails = [r.stream[max(0, r.pos - NGRAM_DEPTH): r.pos].tolist() for r in reqs]
        self.corpus.batch_put(tails)
        self.corpus.synchronize()
        self.corpus.batch_get([r.rid for r in reqs], tails, [r.pos for r in reqs])

    def insert(self, rid: str, prompt: np.ndarray):
        self.corpus.batch_put([prompt.tolist()])
        return lambda: True  # not observable: the next step's synchronize() waits for it

    def insert_done(self, rid: str) -> None:
        self.corpus.synchronize()

    def prompt_insert(self, rid: str, prompt: np.ndarray) -> tuple[float, float]:
        tokens = prompt.tolist()
        t0 = time.perf_counter()
        self.corpus.batch_put([tokens])
        t1 = time.perf_counter()
        self.corpus.synchronize()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t0

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------


class Batch:
    """``size`` live requests on one drafter, renewed when their stream runs out."""

    def __init__(self, side, tokens: Tokens, size: int, tag: str, seed: int, continuation: int):
        self.side, self.tokens, self.tag, self.continuation = side, tokens, tag, continuation
        self.rng = random.Random(seed)
        self.count = 0
        self.reqs = [self._new() for _ in range(size)]

    def _new(self) -> Request:
        self.count += 1
        req = Request(f"{self.tag}-{self.count}", self.tokens.take(CONTEXT_TOKENS + self.continuation),
                      rng=random.Random(self.rng.random()))
        self.side.start(req)
        return req

    def renew(self) -> None:
        """Outside the timed region: replace requests about to run out of
        tokens, and draw what each request accepts next."""
        for i, r in enumerate(self.reqs):
            if r.pos + 3 > len(r.stream):
                self.side.stop(r)
                self.reqs[i] = r = self._new()
            r.draw()

    def close(self) -> None:
        for r in self.reqs:
            self.side.stop(r)


def decode_steps(side, batch: Batch, steps: int, warmup: int = 50) -> list[float]:
    """Microseconds per decode step."""
    clock = time.perf_counter_ns
    out = []
    gc.collect()
    gc.disable()
    try:
        for i in range(warmup + steps):
            batch.renew()
            t0 = clock()
            side.step(batch.reqs)
            dt = clock() - t0
            if i >= warmup:
                out.append(dt / 1e3)
    finally:
        gc.enable()
    return out


def steps_during_inserts(side, batch: Batch, tokens: Tokens, reps: int, size: int = 32768) -> tuple[list, int]:
    """Decode steps (µs) issued while a ``size``-token prompt is being indexed."""
    clock = time.perf_counter_ns
    out, inserts = [], 0
    for rep in range(reps):
        prompt = tokens.take(size)
        rid = f"insert-{rep}"
        gc.collect()
        gc.disable()
        try:
            done = side.insert(rid, prompt)
            first = True
            while first or not done():
                first = False
                batch.renew()
                t0 = clock()
                side.step(batch.reqs)
                out.append((clock() - t0) / 1e3)
        finally:
            gc.enable()
        side.insert_done(rid)
        inserts += 1
    return out, inserts


def prompt_inserts(side, tokens: Tokens, size: int, reps: int) -> dict:
    caller, done = [], []
    for rep in range(reps):
        c, d = side.prompt_insert(f"prompt-{size}-{rep}", tokens.take(size))
        caller.append(c * 1e3)
        done.append(d * 1e3)
    return {"caller_ms": float(np.median(caller)), "done_ms": float(np.median(done)), "reps": reps}


def measure(side, tokens: Tokens, args, log) -> dict:
    res: dict = {}
    rss0 = side.rss_before  # before the drafter was built: LOOKAHEAD allocates its ring up front
    t0 = time.perf_counter()
    side.warm(tokens.warm)
    gc.collect()
    res["warm_s"] = time.perf_counter() - t0
    res["warm_tokens"] = side.warm_tokens
    res["rss_growth_per_token"] = (rss_bytes() - rss0) / side.warm_tokens
    if isinstance(side, LookaheadSide):
        res["bytes_per_token"] = side.bytes_per_token()
        stats = side.cache.stats()
        res["shared_tokens"] = stats["shared_tokens"]
        res["shared_capacity"] = stats["shared_capacity"]
        res["shared_bytes"] = stats["shared_bytes"]
    else:
        res["bytes_per_token"] = res["rss_growth_per_token"]
    log(f"  {side.name}: warmed with {side.warm_tokens:,} tokens in {res['warm_s']:.1f} s")

    for size, reps in ((2048, args.insert_reps * 2), (32768, args.insert_reps)):
        res[f"insert{size // 1024}k"] = prompt_inserts(side, tokens, size, reps)
    log(f"  {side.name}: prompt inserts done")

    continuation = 3 * (args.steps + 50) + 64
    for size in (1, 4):
        batch = Batch(side, tokens, size, f"b{size}", seed=args.seed + size, continuation=continuation)
        samples = decode_steps(side, batch, args.steps)
        res[f"step{size}"] = {"p50": pct(samples, 50), "p99": pct(samples, 99), "mean": float(np.mean(samples)),
                              "n": len(samples)}
        if size == 4:
            samples, inserts = steps_during_inserts(side, batch, tokens, args.insert_steps_reps)
            res["step4_insert"] = {"p50": pct(samples, 50), "p99": pct(samples, 99), "max": float(np.max(samples)),
                                   "n": len(samples), "inserts": inserts}
        batch.close()
        log(f"  {side.name}: batch {size} decode steps done")
    if isinstance(side, LookaheadSide):  # what one live request's own store costs
        side.cache.synchronize()
        before = side.cache.stats()["local_bytes"]
        side.cache.put_prompt("mem-probe", tokens.take(32768))
        side.cache.synchronize()
        res["request_bytes_per_prompt_token"] = (side.cache.stats()["local_bytes"] - before) / 32768
        side.cache.finish("mem-probe")
    return res


def corpus_rounds(side: LookaheadSide, tokens: Tokens, args, log) -> dict:
    """The decode step without and with a ``corpus_tokens`` corpus,
    in ``corpus_rounds`` rounds (see the module docstring); the samples of
    all rounds pooled per case, and each round's batch-4 p50 and p99."""
    corpus = np.random.default_rng(args.seed).integers(0, CORPUS_VOCAB, args.corpus_tokens, dtype=np.int32)
    cases = ("no corpus", "corpus", "corpus, no history")
    pooled = {(c, b): [] for c in cases for b in (1, 4)}
    per_round = []
    add_s = []
    continuation = 3 * (args.corpus_steps + 50) + 64
    for rnd in range(args.corpus_rounds):
        row = {}
        for case in cases:
            if case == "corpus":
                t0 = time.perf_counter()
                side.cache.add_corpus("bench", [corpus])
                add_s.append(time.perf_counter() - t0)
            side.share = case != "corpus, no history"
            for size in (4, 1):
                batch = Batch(side, tokens, size, f"c{rnd}-{case}-{size}", seed=args.seed + 10 * rnd + size,
                              continuation=continuation)
                samples = decode_steps(side, batch, args.corpus_steps if size == 4 else args.corpus_steps // 2)
                batch.close()
                pooled[(case, size)] += samples
                if size == 4:
                    row[case] = (pct(samples, 50), pct(samples, 99))
        side.share = True
        side.cache.remove_corpus("bench")
        gc.collect()
        per_round.append(row)
        log(f"  LOOKAHEAD: corpus round {rnd + 1}/{args.corpus_rounds} done")
    return {"corpus_tokens": args.corpus_tokens, "rounds": per_round, "add_corpus_s": float(np.median(add_s)),
            "pooled": {f"{c}|b{b}": {"p50": pct(v, 50), "p99": pct(v, 99), "n": len(v)}
                       for (c, b), v in pooled.items()}}


def corpus_table(res: dict) -> str:
    p50, p99 = TARGETS["step4_p50"][1], TARGETS["step4_p99"][1]
    cases = ("no corpus", "corpus", "corpus, no history")
    label = {"no corpus": "no corpus", "corpus": f"{res['corpus_tokens'] / 1e6:g}M-token corpus",
             "corpus, no history": f"{res['corpus_tokens'] / 1e6:g}M-token corpus, no history"}
    lines = ["| LOOKAHEAD decode step | batch 1 p50 | batch 1 p99 | batch 4 p50 | batch 4 p99 | "
             "per-round batch-4 p50 / p99 | target (batch 4) | |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cases:
        b1, b4 = res["pooled"][f"{c}|b1"], res["pooled"][f"{c}|b4"]
        rounds = ", ".join(f"{r[c][0]:.0f} / {r[c][1]:.0f}" for r in res["rounds"])
        ok = b4["p50"] <= p50 and b4["p99"] <= p99
        lines.append(f"| {label[c]} | {fmt(b1['p50'], 'µs')} | {fmt(b1['p99'], 'µs')} | {fmt(b4['p50'], 'µs')} | "
                     f"{fmt(b4['p99'], 'µs')} | {rounds} µs | p50 ≤ {p50:.0f} µs, p99 ≤ {p99:.0f} µs | "
                     f"{'PASS' if ok else 'MISS'} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def fmt(v, unit: str) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "n/a"
    if unit.startswith("ms"):
        text = f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms"
        if "/" in unit:  # an insert: add its throughput
            tokens = 1024 * int(unit.split("/")[1].rstrip("k"))
            text += f" ({tokens / v / 1e3:.2f} M tok/s)"
        return text
    if unit == "µs":
        return f"{v:.1f} µs" if v < 1000 else f"{v / 1000:.1f} ms"
    return f"{v:,.0f} B" if v >= 10 else f"{v:.1f} B"


def rows(ng: dict, la: dict) -> list[dict]:
    def get(d, *path):
        for p in path:
            if d is None or p not in d:
                return None
            d = d[p]
        return d

    spec = [
        ("insert 2k prompt: caller thread", ("insert2k", "caller_ms"), "ms", None),
        ("insert 2k prompt: until indexed", ("insert2k", "done_ms"), "ms/2k", None),
        ("insert 32k prompt: caller thread", ("insert32k", "caller_ms"), "ms", None),
        ("index 32k prompt: until indexed", ("insert32k", "done_ms"), "ms/32k", "index32k_done"),
        ("decode step, batch 1, p50", ("step1", "p50"), "µs", None),
        ("decode step, batch 1, p99", ("step1", "p99"), "µs", None),
        ("decode step, batch 4, p50", ("step4", "p50"), "µs", "step4_p50"),
        ("decode step, batch 4, p99", ("step4", "p99"), "µs", "step4_p99"),
        ("batch-4 step during 32k insert, p50", ("step4_insert", "p50"), "µs", None),
        ("batch-4 step during 32k insert, p99", ("step4_insert", "p99"), "µs", "step4_insert_p99"),
        ("memory per indexed token", ("bytes_per_token",), "B", "bytes_per_token"),
        ("  RSS growth / warm tokens inserted", ("rss_growth_per_token",), "B", None),
        ("  request store, per 32k-prompt token", ("request_bytes_per_prompt_token",), "B", None),
    ]
    out = []
    for label, path, unit, target in spec:
        a, b = get(ng, *path), get(la, *path)
        ratio = a / b if a is not None and b is not None and b > 0 else None
        row = {"measure": label, "unit": unit, "ngram": a, "lookahead": b, "ratio": ratio}
        if target:
            op, limit, text = TARGETS[target]
            row["target"] = text
            row["pass"] = b is not None and b <= limit
        out.append(row)
    return out


def table(rows_: list[dict]) -> str:
    lines = ["| measure | NGRAM | LOOKAHEAD | ratio (NGRAM/LOOKAHEAD) | target | |",
             "|---|---|---|---|---|---|"]
    for r in rows_:
        ratio = f"{r['ratio']:.1f}x" if r["ratio"] is not None else ""
        mark = ("PASS" if r["pass"] else "MISS") if "target" in r else ""
        lines.append(f"| {r['measure']} | {fmt(r['ngram'], r['unit'])} | {fmt(r['lookahead'], r['unit'])} | "
                     f"{ratio} | {r.get('target', '')} | {mark} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces-dir", required=True,
                    help="directory of *.jsonl.gz replay traces (recorded token ids; none ship with the package)")
    ap.add_argument("--budget", type=int, default=8, help="draft budget (NGRAM: draft_token_num = budget + 1)")
    ap.add_argument("--warm-tokens", type=int, default=None, help="shared history size (default 1.2M; quick 100k)")
    ap.add_argument("--lookahead-memory-mb", type=int, default=None,
                    help="LOOKAHEAD max_memory_bytes in MiB (default 64: a 1M-token shared ring, which the "
                         "warm history fills; quick 4: 64k tokens)")
    ap.add_argument("--steps", type=int, default=None, help="timed decode steps per batch size (default 3000)")
    ap.add_argument("--quick", action="store_true", help="a fast smoke run (small history, few samples)")
    ap.add_argument("--skip-ngram", action="store_true", help="LOOKAHEAD only (no SGLang import)")
    ap.add_argument("--corpus-tokens", type=int, default=None,
                    help="the external corpus of the corpus rounds (default 10M; quick 1M; 0: no corpus rounds)")
    ap.add_argument("--corpus-rounds", type=int, default=None, help="corpus rounds (default 3; quick 1)")
    ap.add_argument("--corpus-steps", type=int, default=None,
                    help="timed batch-4 steps per case and round (batch 1: half; default 2000, quick 300)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.warm_tokens = args.warm_tokens or (100_000 if args.quick else 1_200_000)
    args.steps = args.steps or (300 if args.quick else 3000)
    args.lookahead_memory_mb = args.lookahead_memory_mb or (4 if args.quick else 64)
    args.insert_reps = 3 if args.quick else 10
    args.insert_steps_reps = 3 if args.quick else 30
    if args.corpus_tokens is None:
        args.corpus_tokens = 1_000_000 if args.quick else 10_000_000
    args.corpus_rounds = args.corpus_rounds or (1 if args.quick else 3)
    args.corpus_steps = args.corpus_steps or (300 if args.quick else 2000)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    log(f"loading traces from {args.traces_dir} ...")
    tokens = load_tokens(args.traces_dir, args.warm_tokens, 300 if args.quick else None, args.seed)
    log(f"  {sum(len(s) for s in tokens.warm):,} warm tokens, {len(tokens.pool):,} more for contexts and prompts")

    results = {}
    la = LookaheadSide(args.budget, args.lookahead_memory_mb << 20)
    try:
        results["lookahead"] = measure(la, tokens, args, log)
        if args.corpus_tokens > 0:
            results["corpus"] = corpus_rounds(la, tokens, args, log)
    finally:
        la.close()
    del la
    gc.collect()
    if not args.skip_ngram:
        tokens.offset = 0  # the same contexts and prompts, in the same order
        log("importing SGLang's NgramCorpus (JIT-compiles on first use) ...")
        ng = NgramSide(args.budget)
        results["ngram"] = measure(ng, tokens, args, log)

    ng_res, la_res = results.get("ngram"), results["lookahead"]
    table_rows = rows(ng_res, la_res)
    print(f"\nDrafter overhead, budget {args.budget} (NGRAM draft_token_num {args.budget + 1}, depth {NGRAM_DEPTH}, "
          f"BFS {NGRAM_MIN_BFS}-{NGRAM_MAX_BFS}, capacity {NGRAM_CAPACITY:,}); real tokens from {args.traces_dir}; "
          f"{CONTEXT_TOKENS}-token contexts; warm history {la_res['warm_tokens']:,} tokens "
          f"(LOOKAHEAD ring: {la_res['shared_tokens']:,}/{la_res['shared_capacity']:,} tokens, "
          f"{la_res['shared_bytes'] / 2**20:.0f} MiB); {la_res['step1']['n']} timed steps per batch size; "
          f"{la_res['step4_insert']['n']} LOOKAHEAD steps during {la_res['step4_insert']['inserts']} 32k inserts"
          + (f", {ng_res['step4_insert']['n']} NGRAM steps during {ng_res['step4_insert']['inserts']}"
             if ng_res else "")
          + f"{' (--quick)' if args.quick else ''}; load average at start {load_start:.1f}, at end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (a loaded machine inflates p99s)\n")
    print(table(table_rows))
    misses = [r["measure"] for r in table_rows if "target" in r and not r["pass"]]
    print(f"\ntargets: {sum(1 for r in table_rows if 'target' in r) - len(misses)} PASS, {len(misses)} MISS"
          + (f" ({'; '.join(misses)})" if misses else ""))
    if "corpus" in results:
        c = results["corpus"]
        print(f"\nWith an external corpus: {c['corpus_tokens']:,} random token ids (add_corpus: "
              f"{c['add_corpus_s']:.1f} s), {args.corpus_rounds} rounds of {args.corpus_steps} batch-4 and "
              f"{args.corpus_steps // 2} batch-1 steps per case, pooled; the warm history as above\n")
        print(corpus_table(c))
    print(f"total time {time.perf_counter() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            machine = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
                       "loadavg_start": load_start, "loadavg_end": os.getloadavg()[0]}
            json.dump({"args": vars(args), "machine": machine, "rows": table_rows, "raw": results}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
