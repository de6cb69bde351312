#!/usr/bin/env bash
# One prepared GPU check (issue 4), for the lent H200 machine: builds the Cython
# trie there, runs the CUDA parts of the graph-runner tests, then gpu_check.py
# (graph vs eager bit-identity, greedy equality, per-step timings). It needs only
# what that machine has (torch, transformers, cython, numpy) and ends well within
# 10 minutes. Output goes to stdout and, when $OUT is set, to $OUT/gpu_check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-/tmp}/gpu_check.log
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 setup.py -q build_ext --inplace
  PYTHONUNBUFFERED=1 python3 -m pytest -q tests/test_graph_runner.py -p no:cacheprovider
  PYTHONUNBUFFERED=1 timeout 480 python3 scripts/gpu_check.py
} 2>&1 | tee "$LOG"
