#!/usr/bin/env bash
# Validate LOOKAHEAD on your own CUDA machine and model, with SGLang 0.5.23 and
# this package installed (pip install .):
#
#   scripts/gpu_check.sh --model-path meta-llama/Llama-3.1-8B-Instruct [--extra-server-args "..."]
#       [--draft-model-path EAGLE_HEAD [--eagle-algorithm EAGLE3] [--hybrid-only]]
#
# Runs the feature matrix against plain decoding (tree and one-branch, with
# overlap scheduling and CUDA graphs), then bench_serving at concurrency 1, 4
# and 16 for plain, NGRAM and LOOKAHEAD with LOOKAHEAD's steps by path; with
# --draft-model-path, the same matrix for EAGLE and for LOOKAHEAD + EAGLE
# (--speculative-lookahead-hybrid, trees and chains) and their bench_serving
# figures with the hybrid's steps by draft source. It has not been timed on
# such a machine: expect most of the time in server start-ups (one per
# configuration, 40-60 s each where we have seen them) and the bench_serving
# runs (docs/gpu_runs.md records what ran on a GPU). Exits non-zero when an
# answer differs from plain decoding or a step took an unintended path; for
# bfloat16/float16 weights, answers may part from plain decoding's at a near
# tie of plain decoding's own two best tokens (--numerics, lookahead/validate/numerics.py).
# Output goes to stdout and artifacts/gpu_check/gpu_check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p artifacts/gpu_check
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
  PYTHONUNBUFFERED=1 python3 -m lookahead.validate "$@"
} 2>&1 | tee artifacts/gpu_check/gpu_check.log
