"""Environment, server flags and Engine kwargs to run real sglang on a CPU.

What is mandatory on a CPU-only machine, and why:

* ``SGLANG_USE_CPU_ENGINE=1`` with ``--device cpu``: otherwise ``--device cpu``
  still reaches CUDA-only code.
* The pure-torch ``sgl_kernel`` (``cpu_sgl_kernel/``) first on ``PYTHONPATH``:
  the CPU engine imports ``sgl_kernel`` at module level and no CPU build is
  published.
* ``LOOKAHEAD_CPU_FORCE_AMX=1`` (read by ``cpu_sgl_kernel/sitecustomize.py``):
  without AMX, ``--attention-backend intel_amx`` silently falls back to
  ``torch_native``, which cannot run speculative TARGET_VERIFY batches.
* ``--attention-backend intel_amx --disable-cuda-graph``; ``--sleep-on-idle``
  (else an idle scheduler spins a core at 100 %); a small
  ``--max-total-tokens`` (the KV pool lives in host RAM) with a
  ``--mem-fraction-static`` high enough that the RAM used by the process
  itself does not exhaust the budget (it is a fraction of free host RAM; 0.05
  fails).
* ``--dtype float32`` (a choice, not a must): with ``auto`` sglang runs a
  float32 checkpoint in float16; float32 keeps greedy outputs of plain and
  speculative decoding bit-comparable (``bfloat16`` also works and exercises
  the packed-linear ops).
* ``HF_HUB_OFFLINE=1``; ``CUDA_VISIBLE_DEVICES=""`` so that a GPU host still
  runs the CPU engine; ``SGLANG_JIT_CACHE_DIR`` for the NGRAM corpus, which is
  C++ compiled on first use (~20 s, then cached).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Optional

from lookahead import check_sglang_version

_HERE = Path(__file__).resolve().parent
_SHIM_DIR = _HERE / "cpu_sgl_kernel"

# Server flags for ``python -m sglang.launch_server`` (model path not included).
CPU_SERVER_ARGS: list[str] = [
    "--device", "cpu",
    "--dtype", "float32",
    "--attention-backend", "intel_amx",
    "--disable-cuda-graph",
    "--mem-fraction-static", "0.7",
    "--max-total-tokens", "8192",
    "--max-running-requests", "8",
    "--sleep-on-idle",
]

_ENGINE_DEFAULTS = dict(
    device="cpu",
    dtype="float32",
    attention_backend="intel_amx",
    disable_cuda_graph=True,
    mem_fraction_static=0.7,
    max_total_tokens=8192,
    max_running_requests=8,
    sleep_on_idle=True,
)


def cpu_sgl_kernel_path() -> str:
    """Directory to put first on ``PYTHONPATH``: holds the ``sgl_kernel`` shim.

    The shim is in a source checkout only: the package installs without it
    (see setup.py), so that an installed copy never shadows ``sgl_kernel``."""
    if not (_SHIM_DIR / "sgl_kernel" / "__init__.py").exists():
        raise RuntimeError(
            f"the CPU stand-in for sgl_kernel is not in {_SHIM_DIR}: it is not installed with the package; "
            "run the tests and the demo from a checkout of sglang-lookahead (pip install -e .)"
        )
    return str(_SHIM_DIR)


def default_cache_dir() -> Path:
    """``$LOOKAHEAD_CACHE_DIR``, else ``<repo>/.cache`` in a checkout, else
    ``~/.cache/lookahead``."""
    if os.environ.get("LOOKAHEAD_CACHE_DIR"):
        return Path(os.environ["LOOKAHEAD_CACHE_DIR"])
    repo = _HERE.parent
    if (repo / ".git").exists():
        return repo / ".cache"
    return Path.home() / ".cache" / "lookahead"


def _prepend_path(entry: str, current: Optional[str]) -> str:
    parts = [p for p in (current or "").split(os.pathsep) if p and p != entry]
    return os.pathsep.join([entry, *parts])


def cpu_env(
    base_env: Optional[Mapping[str, str]] = None, cache_dir: Optional[os.PathLike] = None
) -> dict[str, str]:
    """A copy of ``base_env`` (default ``os.environ``) set up for the CPU engine;
    pass it as ``env=`` to a server subprocess.  Raises unless the supported
    sglang release is installed: the stand-ins mirror its call sites."""
    check_sglang_version(consequence=f"The CPU stand-in for sgl_kernel in {_SHIM_DIR} mirrors its CPU call sites")
    env = dict(os.environ if base_env is None else base_env)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        LOOKAHEAD_CPU_FORCE_AMX="1",
        LOOKAHEAD_CPU_SAMPLED_VERIFY="1",
        PYTHONPATH=_prepend_path(cpu_sgl_kernel_path(), env.get("PYTHONPATH")),
        SGLANG_JIT_CACHE_DIR=str(cache / "sglang_jit"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
        SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK="1",
    )
    return env


def apply_cpu_env(cache_dir: Optional[os.PathLike] = None) -> dict[str, str]:
    """Set up *this* process for ``sgl.Engine``; call before importing sglang.

    Updates ``os.environ`` (inherited by Engine's scheduler subprocesses, whose
    interpreter start then runs the shim's ``sitecustomize``), puts the shim on
    ``sys.path`` and installs the AMX import hook here. Raises if sglang or a
    different ``sgl_kernel`` is already imported, since the CPU-path decisions
    are taken at import time. Calling it again once it has run (a script
    running several benchmarks in one process) returns the same environment.
    """
    global _APPLIED
    if _APPLIED is not None:
        return dict(_APPLIED)
    if "sglang.srt.utils.common" in sys.modules:
        raise RuntimeError("apply_cpu_env() must run before sglang is imported")
    loaded = sys.modules.get("sgl_kernel")
    if loaded is not None and not getattr(loaded, "IS_CPU_SHIM", False):
        raise RuntimeError(f"a different sgl_kernel is already imported: {loaded!r}")

    env = cpu_env(cache_dir=cache_dir)
    os.environ.update(env)
    shim = cpu_sgl_kernel_path()
    if shim in sys.path:
        sys.path.remove(shim)
    sys.path.insert(0, shim)
    Path(env["SGLANG_JIT_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    _install_amx_hook()
    _APPLIED = dict(env)
    return env


# The environment apply_cpu_env() set up in this process, once it has.
_APPLIED: Optional[dict] = None


def _install_amx_hook() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_lookahead_cpu_sitecustomize", _SHIM_DIR / "sitecustomize.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not module.install():
        raise RuntimeError("sglang.srt.utils.common was imported before apply_cpu_env()")


def cpu_server_args(**overrides) -> list[str]:
    """``CPU_SERVER_ARGS`` with ``--flag value`` overrides (``max_total_tokens=4096``;
    ``True`` adds a bare flag)."""
    args = list(CPU_SERVER_ARGS)
    for key, value in overrides.items():
        flag = "--" + key.replace("_", "-")
        if flag in args:
            i = args.index(flag)
            bare = i + 1 >= len(args) or args[i + 1].startswith("--")
            del args[i : i + (1 if bare else 2)]
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:  # 0 is a value (0 == False)
            args += [flag, str(value)]
    return args


def cpu_engine_kwargs(**overrides) -> dict:
    """Keyword arguments for ``sgl.Engine`` on CPU, updated with ``overrides``."""
    return {**_ENGINE_DEFAULTS, **overrides}
