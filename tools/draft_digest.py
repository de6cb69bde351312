"""Fingerprint every LOOKAHEAD draft of a replay, to check that a change
leaves drafting exactly as it was.

    PYTHONPATH=OLD_CHECKOUT python tools/draft_digest.py --out old.npz
    python tools/draft_digest.py --out new.npz --compare old.npz

replays the shared traces (``lookahead.replay``'s protocol) and records a
64-bit hash of each draft (tokens and parents) in order, per trace, budget
and mode (tree or one-branch), with the AL.  ``--compare`` reports, per run,
whether every draft is equal and where the first difference is.  It uses
only the public ``LookaheadCache`` API, so it runs against older checkouts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TRACES = ("sharegpt", "humaneval", "synth_code_edit", "synth_rag")


class _Fingerprinting:
    """A replay drafter that hashes the drafts of the one it wraps."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.hashes: list[int] = []

    def start(self, rid, prompt):
        self.inner.start(rid, prompt)

    def draft(self, rid, context, budget):
        tokens, parents = self.inner.draft(rid, context, budget)[:2]
        self.hashes.append(hash((tuple(tokens), tuple(parents))))
        return tokens, parents

    def accept(self, rid, context, new_tokens):
        self.inner.accept(rid, context, new_tokens)

    def finish(self, rid):
        self.inner.finish(rid)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    ap.add_argument("--trace", action="append", choices=TRACES, help="default: all four")
    ap.add_argument("--budget", type=int, nargs="+", default=[8])
    ap.add_argument("--modes", default="tree,chain", help="tree, chain or both (default)")
    ap.add_argument("--memory-kb", type=int, help="max_memory_bytes / 1024 (default: the cache's; small: eviction)")
    ap.add_argument("--out", required=True, help=".npz of the fingerprints")
    ap.add_argument("--compare", help="an earlier --out to compare with")
    args = ap.parse_args(argv)

    from lookahead.replay import baselines
    from lookahead.replay import load_trace, replay

    print(f"lookahead from {os.path.dirname(baselines.__file__)}", flush=True)
    arrays, lines = {}, []
    for trace in args.trace or TRACES:
        pairs = load_trace(os.path.join(args.traces_dir, f"{trace}.jsonl.gz"))
        for budget in args.budget:
            for mode in args.modes.split(","):
                config = {"max_memory_bytes": args.memory_kb << 10} if args.memory_kb else {}
                drafter = _Fingerprinting(baselines.LookaheadDrafter(one_branch=mode == "chain", **config))
                t0 = time.perf_counter()
                res = replay(drafter, pairs, budget, trace)
                drafter.inner.cache.close()
                key = f"{trace}-b{budget}-{mode}"
                arrays[key] = np.asarray(drafter.hashes, dtype=np.int64)
                lines.append(f"{key}: AL {res.acceptance_length:.6f}, {len(drafter.hashes):,} drafts "
                             f"({time.perf_counter() - t0:.0f} s)")
                print(lines[-1], flush=True)
    np.savez(args.out, **arrays)
    if args.compare:
        with np.load(args.compare) as old:
            for key, new in arrays.items():
                if key not in old:
                    print(f"{key}: not in {args.compare}")
                    continue
                ref = old[key]
                n = min(len(ref), len(new))
                diff = np.flatnonzero(ref[:n] != new[:n])
                if len(ref) == len(new) and not len(diff):
                    print(f"{key}: all {len(new):,} drafts identical")
                else:
                    first = int(diff[0]) if len(diff) else n
                    print(f"{key}: DIFFERENT ({len(ref):,} vs {len(new):,} drafts, first difference at {first:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
