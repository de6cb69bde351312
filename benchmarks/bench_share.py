#!/usr/bin/env python
"""What sharing the history across a fleet (``--speculative-lookahead-share``)
adds to a decode step, side by side.

The step is the host work LOOKAHEAD's worker does per decode step
(``bench_trie.py``'s: each request's 1-3 accepted tokens, then a draft of
the batch, over a warm shared history of real tokens with 4k-token
contexts), at batch 1 and batch 4, in two cases:

* ``alone``: no sharing;
* ``shared``: the replica's ``FleetShare`` live on a real ``redis-server``
  (started here), publishing each request this replica finishes and
  inserting, on its reader thread, what another replica (a separate
  process, as in a fleet) publishes at ``--rate`` finished requests per
  second (default 50: a fleet of 16 replicas each finishing about 3 a
  second), each a ``--prompt``-token prompt and ``--output``-token answer
  from the traces.

Each case runs ``--seconds`` of back-to-back steps per round, in
``--rounds`` rounds (at least 3) whose case order rotates; the table gives
the median step and its range over rounds, and the added time as a share
of the step itself and of a whole decode step of ``--decode-ms`` (the
forward pass that the host work sits beside; a 7-8B model's batch-1 decode
step on an H100 is about 7 ms, a CPU decode step far longer).

    python benchmarks/bench_share.py --traces-dir DIR   # DIR: *.jsonl.gz replay traces
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests" / "support")]

from bench_trie import Batch, LookaheadSide, load_tokens, pct  # noqa: E402
from lookahead.plugin.share import FleetShare  # noqa: E402
from lookahead.replay import load_trace  # noqa: E402

MODEL = "bench-share"
MAXLEN = 1000  # the stream's cap: a replica's warm start (not measured) reads at most this many


def publisher(url: str, rate: float, traces_dir: str, prompt_len: int, output_len: int) -> None:
    """The other replica: publishes finished requests at ``rate`` per second until killed."""
    import glob

    share = FleetShare(url, MODEL, None, read=False, maxlen=MAXLEN).start()
    pairs = []
    for path in sorted(glob.glob(os.path.join(traces_dir, "*.jsonl.gz"))):
        pairs += [(p[-prompt_len:], r[:output_len]) for p, r in load_trace(path, 400)]
    period, i, next_t = 1.0 / rate, 0, time.monotonic()
    while True:
        p, r = pairs[i % len(pairs)]
        share.publish_text(p, r, None)
        i += 1
        next_t += period
        time.sleep(max(0.0, next_t - time.monotonic()))


def run_case(case: str, batch_size: int, tokens, args, broker) -> dict:
    url = broker.url()
    side = LookaheadSide(args.budget, 1 << 30)
    side.warm(tokens.warm)
    share = None
    if case == "shared":
        backlog = broker.client().xlen(f"lookahead:{MODEL}:history")
        share = FleetShare(url, MODEL, side.cache, vocab=None, maxlen=MAXLEN).start()
        stop = side.stop

        def stop_and_publish(req):  # this replica's finished requests go to the fleet too
            share.publish_text(req.stream[:4096], req.stream[4096: req.pos], None)
            stop(req)
        side.stop = stop_and_publish
        deadline = time.monotonic() + 60
        while share.stats()["received"] < 0.9 * backlog and time.monotonic() < deadline:
            time.sleep(0.05)  # its warm start over the stream's backlog: before the clock, not measured
    batch = Batch(side, tokens, batch_size, f"{case}{batch_size}", args.seed, args.continuation)
    samples = []
    received0 = share.stats()["received"] if share else 0
    deadline = time.monotonic() + args.seconds
    clock = time.perf_counter_ns
    for _ in range(50):  # warm-up
        batch.renew()
        side.step(batch.reqs)
    while time.monotonic() < deadline:
        batch.renew()
        t0 = clock()
        side.step(batch.reqs)
        samples.append((clock() - t0) / 1e3)
    received = (share.stats()["received"] - received0) if share else 0
    batch.close()
    stats = share.stats() if share else {}
    if share:
        share.close()
    side.close()
    return {"p50": pct(samples, 50), "p99": pct(samples, 99), "steps": len(samples), "received": received,
            "lag_ms_p50": stats.get("lag_ms_p50"), "lag_ms_p99": stats.get("lag_ms_p99")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="steps per case and round, in seconds")
    ap.add_argument("--rate", type=float, default=50.0, help="finished requests per second the fleet publishes")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--output", type=int, default=256)
    ap.add_argument("--budget", type=int, default=7)
    ap.add_argument("--warm-tokens", type=int, default=1_000_000)
    ap.add_argument("--continuation", type=int, default=512)
    ap.add_argument("--decode-ms", type=float, default=7.0,
                    help="a whole decode step's time, for the added time's share of it (default 7 ms)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--publisher", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.publisher:
        publisher(args.publisher, args.rate, args.traces_dir, args.prompt, args.output)
        return 0
    if args.rounds < 3:
        ap.error("--rounds must be >= 3")
    from redis_server import RedisServer

    tokens = load_tokens(args.traces_dir, args.warm_tokens, None, args.seed)
    broker = RedisServer(REPO / ".cache" / "bench_share_redis").start()
    pub = subprocess.Popen([sys.executable, __file__, "--publisher", broker.url(), "--rate", str(args.rate),
                            "--traces-dir", args.traces_dir, "--prompt", str(args.prompt),
                            "--output", str(args.output)])
    cases = [(c, b) for b in (1, 4) for c in ("alone", "shared")]
    rounds = []
    try:
        time.sleep(2.0)
        for rnd in range(args.rounds):
            k = rnd % len(cases)
            order = cases[k:] + cases[:k]  # rotated: no case always runs first or last
            res = {}
            for case, b in order:
                res[f"{case}{b}"] = run_case(case, b, tokens, args, broker)
                print(f"round {rnd + 1} {case} batch {b}: p50 {res[f'{case}{b}']['p50']:.1f} µs "
                      f"({res[f'{case}{b}']['steps']} steps, {res[f'{case}{b}']['received']} entries inserted)",
                      flush=True)
            rounds.append(res)
    finally:
        pub.kill()
        pub.wait()
        broker.stop()
    print(f"\nDecode-step host work, {args.rounds} rounds rotated, the other replica publishing {args.rate:g} "
          f"finished requests/s ({args.prompt}-token prompts, {args.output}-token answers):\n")
    print("| batch | alone p50 (range) | shared p50 (range) | added | of the host step | of a "
          f"{args.decode_ms:g} ms decode step | shared p99 / alone p99 | lag p50 / p99 |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for b in (1, 4):
        a = [r[f"alone{b}"]["p50"] for r in rounds]
        s = [r[f"shared{b}"]["p50"] for r in rounds]
        ap99 = np.median([r[f"alone{b}"]["p99"] for r in rounds])
        sp99 = np.median([r[f"shared{b}"]["p99"] for r in rounds])
        added = float(np.median(s) - np.median(a))
        lag50 = np.median([r[f"shared{b}"]["lag_ms_p50"] for r in rounds])
        lag99 = np.median([r[f"shared{b}"]["lag_ms_p99"] for r in rounds])
        summary[b] = {"alone_p50": a, "shared_p50": s, "added_us": added,
                      "of_decode_step": added / (args.decode_ms * 1e3)}
        print(f"| {b} | {np.median(a):.1f} µs ({min(a):.1f}-{max(a):.1f}) | {np.median(s):.1f} µs "
              f"({min(s):.1f}-{max(s):.1f}) | {added:+.1f} µs | {100 * added / np.median(a):+.1f} % | "
              f"{100 * added / (args.decode_ms * 1e3):+.2f} % | {sp99:.0f} / {ap99:.0f} µs | "
              f"{lag50:.1f} / {lag99:.1f} ms |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
