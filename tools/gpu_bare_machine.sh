#!/usr/bin/env bash
# Run lookahead/validate/__main__.py on a bare CUDA machine: Python 3.12 and torch with
# CUDA, but no sglang, sglang-kernel or flashinfer, and no package registry
# (the GPU machine this project is sometimes lent). Users with SGLang
# installed run scripts/gpu_check.sh instead.
#
# What it needs in the checkout, prepared on a machine with PyPI access:
#   .whl/      sglang 0.5.23 and the light dependencies the GPU machine lacks,
#              as cp312 manylinux wheels (sglang's Rust extensions and
#              multimodal_gen stripped to fit the transfer);
#   .gpu/tiny  the tiny local model: python tools/tiny_model.py .gpu/tiny
#
# Kernels that SGLang would take from sglang-kernel, flashinfer or its own
# JIT builds come from tools/bare_gpu (pure torch; see its
# sitecustomize.py); attention is SGLang's Triton backend. Output: $OUT (or
# artifacts/bare_gpu): run.log, pip.log, build.log, gpu_check_{a,b,c}.log, and
# logs.tgz with every server's log and each part's gpu_check.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${OUT:-artifacts/bare_gpu}" && cd "${OUT:-artifacts/bare_gpu}" && pwd)
exec > >(tee -a "$OUT/run.log") 2>&1
BUDGET=${BUDGET:-300}  # seconds for gpu_check, counted from the start
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"

SITE=/tmp/site
stamp "installing wheels and building the trie"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
  > "$OUT/pip.log" 2>&1 &
pip_pid=$!
python3 setup.py -q build_ext --inplace -j 16 > "$OUT/build.log" 2>&1
build_rc=$?
wait $pip_pid; pip_rc=$?
stamp "pip rc=$pip_rc, build rc=$build_rc"
tail -5 "$OUT/pip.log"; tail -20 "$OUT/build.log"
[ $pip_rc -eq 0 ] && [ $build_rc -eq 0 ] || exit 1

# The plugin's entry point, as `pip install` would register it.
DIST="$SITE/sglang_lookahead-0.1.0.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: sglang-lookahead\nVersion: 0.1.0\n' > "$DIST/METADATA"
printf '[sglang.srt.plugins]\nlookahead = lookahead.plugin:register\n' > "$DIST/entry_points.txt"

export PYTHONPATH="$PWD/tools/bare_gpu:$SITE:$PWD"
export LOOKAHEAD_BARE_GPU=1 SGLANG_FORCE_FUSED_OP_BACKEND=torch SGLANG_IS_FLASHINFER_AVAILABLE=false
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# sglang's Rust radix-tree core is built against torch 2.14; with another torch
# it reads dtypes wrong ("insert value must be an int64 tensor, got QInt8").
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
# Full-precision float32 dots in Triton (its default on Hopper is TF32): the
# tiny model runs in float32, and TF32 rounding would differ between the
# extend (verify) and decode attention kernels, flipping greedy near-ties of a
# random model that plain and speculative decoding should resolve alike.
export TRITON_F32_DEFAULT=ieee
python3 -m pip check 2>&1 | grep -v -i "torch\|nvidia\|cuda\|flash\|sglang-kernel\|kernels\|tilelang\|quack\|deep\|cutlass\|mathdx\|nvshmem\|humming\|mistral\|modelscope\|timm\|outlines\|easydict\|py-spy\|tml-renderers\|smg-grpc\|torchcodec\|torchaudio\|torch-memory" | head -20
# A small KV pool: three servers share the GPU at a time.
SERVER_ARGS="--attention-backend triton --sampling-backend pytorch --dtype float32 --mem-fraction-static 0.15 --max-total-tokens 262144"
check() {  # $1: seconds, $2: name, $3: extra server flags, then gpu_check's --configs
  local budget=$1 name=$2 extra=$3; shift 3
  stamp "gpu_check $name on the tiny model (${budget} s at most): $*"
  timeout -k 10 "$budget" python3 -m lookahead.validate --model-path .gpu/tiny --num-draft-tokens 8 \
    --concurrency 1 4 16 --prompts-per-concurrency 2 --output-len 64 --server-timeout 180 \
    --extra-server-args "$SERVER_ARGS $extra" --out-dir "/tmp/$name" --configs "$@" > "$OUT/$name.log" 2>&1
  stamp "gpu_check $name rc=$?"
}
snapshot() {  # the servers' logs, refreshed while the checks run: a call cut off still returns them
  tar czf "$OUT/.logs.tgz" -C /tmp gpu_check_a gpu_check_b gpu_check_c 2>/dev/null
  mv -f "$OUT/.logs.tgz" "$OUT/logs.tgz"
}
# Three parts side by side, the first two with their own plain reference
# (the third only benchmarks): a server takes 40-60 s to come up there
# (imports and tokenizer start-up, on the CPU), so one after another the six
# would not fit a 15-minute lease.
left=$(( BUDGET - ($(date +%s) - t0) ))
check "$left" gpu_check_a "${EXTRA_SERVER_ARGS:-}" lookahead lookahead-1b & a=$!
check "$left" gpu_check_b "${EXTRA_SERVER_ARGS:-}" plain & b=$!
check "$left" gpu_check_c "${EXTRA_SERVER_ARGS:-}" ngram lookahead-auto & c=$!
( while sleep 20; do snapshot; done ) & snapper=$!
# Wait for the checks by pid: a bare `wait` would also wait for the `tee` of
# this script's own output, which never ends.
wait $a $b $c
kill $snapper 2>/dev/null
snapshot
for part in a b c; do grep -v "^\[20[0-9][0-9]-" "$OUT/gpu_check_$part.log" | tail -40; done
stamp done
