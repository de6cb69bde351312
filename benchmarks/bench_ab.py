#!/usr/bin/env python
"""Interleaved A/B of the batch-4 decode step: another revision's LOOKAHEAD
against this checkout's, in one process.

This shared VM's speed drifts from minute to minute by more than most
changes to drafting are worth, for both builds alike.  So both run in one
process, on the same warm history (``bench_trie.py``'s: real trace tokens,
4k-token contexts, 1-3 accepted tokens per request and step), taking turns
step by step; each round swaps which goes first (the second of a pair gains
a little from the first's warm caches).  The ratio B/A (this checkout over
the other) of each round's p50 and p99 is what to read.

    python benchmarks/bench_ab.py --base main

The other revision is exported with ``git archive``, renamed to a package of
its own (``lookahead_ab``) and built once into ``.cache/bench_ab/<rev>``.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

import bench_trie  # noqa: E402
from lookahead.trie.cache import LookaheadCache  # noqa: E402


def build_revision(rev: str) -> type:
    """``rev``'s LookaheadCache class, built as package ``lookahead_ab``."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    root = REPO / ".cache" / "bench_ab" / commit
    pkg = root / "lookahead_ab"
    if not (root / "built").exists():
        pkg.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit, "lookahead"], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "--strip-components=1", "-C", str(pkg)], input=archive.stdout, check=True)
        for path in list(pkg.glob("*.py")) + list(pkg.glob("*.pyx")) + list(pkg.glob("*.pxd")):
            text = re.sub(r"\b(from|import|cimport) lookahead([.\s])", r"\1 lookahead_ab\2", path.read_text())
            path.write_text(text)
        # Every Cython module the revision has (one _trie.pyx before the split).
        setup = root / "setup_ab.py"
        setup.write_text(
            "import glob, os\n"
            "import numpy as np\n"
            "from setuptools import Extension, setup\n"
            "from Cython.Build import cythonize\n"
            "exts = [Extension('lookahead_ab.' + os.path.basename(p)[:-4], [p], language='c++',\n"
            "                  include_dirs=[np.get_include(), 'lookahead_ab'],\n"
            "                  extra_compile_args=['-std=c++17', '-pthread', '-O3'], extra_link_args=['-pthread'],\n"
            "                  define_macros=[('NPY_NO_DEPRECATED_API', 'NPY_1_7_API_VERSION')])\n"
            "        for p in sorted(glob.glob('lookahead_ab/*.pyx'))]\n"
            "setup(name='lookahead_ab', ext_modules=cythonize(exts, language_level=3),\n"
            "      script_args=['build_ext', '--inplace'])\n")
        subprocess.run([sys.executable, str(setup)], cwd=root, check=True, capture_output=True)
        (root / "built").touch()
    sys.path.insert(0, str(root))
    from lookahead_ab.cache import LookaheadCache as Other

    return Other


class Side(bench_trie.LookaheadSide):
    """bench_trie's LOOKAHEAD driver around a given cache class."""

    def __init__(self, cache_class: type, budget: int, memory_bytes: int):
        self.rss_before = 0
        self.budget = budget
        self.cache = cache_class(max_memory_bytes=memory_bytes)
        self.warm_tokens = 0


def timed_step(side: Side, batch: bench_trie.Batch) -> float:
    batch.renew()
    t0 = time.perf_counter_ns()
    side.step(batch.reqs)
    return (time.perf_counter_ns() - t0) / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the git revision to compare this checkout with (A)")
    ap.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    ap.add_argument("--warm-tokens", type=int, default=1_200_000)
    ap.add_argument("--memory-mb", type=int, default=64)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3000, help="timed steps per build and round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (each swaps which build goes first)")
    args = ap.parse_args(argv)

    other = build_revision(args.base)
    tokens = bench_trie.load_tokens(args.traces_dir, args.warm_tokens, None, 0)
    sides = {"A": Side(other, args.budget, args.memory_mb << 20), "B": Side(LookaheadCache, args.budget,
                                                                            args.memory_mb << 20)}
    for side in sides.values():
        side.warm(tokens.warm)
    # The same contexts for both: each batch cuts them from its own copy of the pool.
    batches = {}
    for name, side in sides.items():
        copy = bench_trie.Tokens(tokens.warm, tokens.pool)
        batches[name] = bench_trie.Batch(side, copy, 4, f"ab-{name}", 1, 3 * (args.steps + 50) + 64)
    print(f"A = {args.base}, B = this checkout; {args.steps} batch-4 steps per build and round, "
          f"warm history {sides['B'].cache.stats()['shared_tokens']:,} tokens, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| round | first | A p50 | B p50 | B/A p50 | A p99 | B p99 | B/A p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for rnd in range(args.rounds):
        order = ("A", "B") if rnd % 2 == 0 else ("B", "A")
        times = {"A": [], "B": []}
        gc.collect()
        gc.disable()
        try:
            for _ in range(50):  # warm-up
                for name in order:
                    timed_step(sides[name], batches[name])
            for _ in range(args.steps):
                for name in order:
                    times[name].append(timed_step(sides[name], batches[name]))
        finally:
            gc.enable()
        a50, b50 = np.percentile(times["A"], 50), np.percentile(times["B"], 50)
        a99, b99 = np.percentile(times["A"], 99), np.percentile(times["B"], 99)
        print(f"| {rnd + 1} | {order[0]} | {a50:.1f} µs | {b50:.1f} µs | {b50 / a50:.3f} | {a99:.1f} µs | "
              f"{b99:.1f} µs | {b99 / a99:.3f} |", flush=True)
    for side in sides.values():
        side.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
