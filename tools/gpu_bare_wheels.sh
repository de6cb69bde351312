#!/usr/bin/env bash
# Download what tools/gpu_bare_machine.sh installs on a bare GPU machine
# (Python 3.12, torch with CUDA, no registry) into .whl/: sglang 0.5.23 and the
# light dependencies that machine lacks, as cp312 manylinux wheels, with
# sglang's Rust extensions (not on the text-serving path) and multimodal_gen
# stripped so that the checkout, the wheels and the tiny model fit the 64 MiB
# a device call carries (about 50 MiB of wheels). Also builds .gpu/tiny.
# Packages the machine already has (torch, numpy, tokenizers, huggingface-hub,
# pandas, pyarrow...) are not downloaded; IPython is a stand-in
# (tools/bare_gpu/IPython). Run here, then
#   device run: OUT=$OUT BUDGET=390 bash tools/gpu_bare_machine.sh   (carry .whl and .gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.whl/" .git/info/exclude || echo "/.whl/" >> .git/info/exclude
grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
mkdir -p .whl
PINS=(
  annotated_types==0.8.0
  anthropic==2.17.0
  apache_tvm_ffi==0.1.11
  cffi==2.1.1
  compressed_tensors==0.18.0
  datasets==5.2.0
  dill==0.4.1
  distro==1.9.0
  docstring_parser==0.18.0
  fastapi==0.165.0
  gguf==0.19.0
  httpcore2==2.16.2
  httpx2==2.16.2
  interegular==0.3.3
  jiter==0.19.0
  jsonschema==4.26.0
  jsonschema_specifications==2025.9.1
  loguru==0.7.3
  msgspec==0.23.0
  multiprocess==0.70.19
  openai==2.8.0
  opentelemetry_api==1.45.2
  orjson==3.13.0
  partial_json_parser==0.2.1.1.post7
  pybase64==1.5.1
  pycparser==3.12
  pydantic==2.14.4
  pydantic_core==2.50.5
  python_multipart==0.0.34
  pyzmq==27.3.0
  referencing==0.37.0
  regex==2026.11.19
  rpds_py==2026.9.1
  setproctitle==1.3.8
  sglang==0.5.23
  shellingham==1.5.4
  sniffio==1.3.1
  soundfile==0.13.1
  starlette==1.10.0
  transformers==5.19.0
  truststore==0.10.5
  typing_extensions==4.16.0
  typing_inspection==0.4.5
  uvicorn==0.55.0
  watchfiles==1.3.0
  xgrammar==0.2.7
  zstandard==0.25.0
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl "${PINS[@]}"
python3 - <<'PY'
import glob, os, shutil, zipfile
(wheel,) = glob.glob(".whl/sglang-0.5.23-cp312-*.whl")
if os.path.getsize(wheel) > 30 << 20:  # not stripped yet
    drop = lambda n: (n.startswith("sglang/srt/rust_extensions/") and n.endswith(".so")) or n.startswith("sglang/multimodal_gen/")
    full = wheel + ".full"
    shutil.move(wheel, full)
    with zipfile.ZipFile(full) as zin, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if drop(info.filename):
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = ("\n".join(l for l in data.decode().splitlines() if not drop(l.split(",")[0])) + "\n").encode()
            zout.writestr(info, data)
    os.remove(full)
PY
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" tools/tiny_model.py .gpu/tiny
du -sh .whl .gpu
