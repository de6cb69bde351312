"""Building and resolving ``ServerArgs`` records in-process, as the launcher
does, for the tests that check LOOKAHEAD's options without running a model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SGL_KERNEL_SHIM = REPO / "cpu" / "cpu_sgl_kernel"

# Resolution imports sglang's memory pools, which import sgl_kernel at module
# level; on a CPU-only machine only the repository's pure-torch stand-in exists
# (which another test module may have imported already: subprocesses need it
# on their path all the same).
_SPEC = importlib.util.find_spec("sgl_kernel")
_EXTRA_PATH = (
    [str(SGL_KERNEL_SHIM)]
    if (_SPEC is None or str(SGL_KERNEL_SHIM) in str(_SPEC.origin)) and SGL_KERNEL_SHIM.is_dir()
    else []
)
sys.path[:0] = [p for p in _EXTRA_PATH if p not in sys.path]


def _resolve(server_args):
    """Resolve as the launcher does, on a machine that has the intel_amx backend
    (otherwise sglang falls back to torch_native, which LOOKAHEAD rejects)."""
    from sglang.srt.runtime_context import override_platform

    with override_platform(has_amx=True):
        server_args.resolve_once()
    return server_args


def _engine_args(model_dir, **kwargs):
    """A record built the way ``sgl.Engine(**kwargs)`` builds it."""
    from sglang.srt.entrypoints.engine import Engine

    base = dict(
        model_path=model_dir,
        device="cpu",
        attention_backend="intel_amx",
        speculative_algorithm="LOOKAHEAD",
    )
    return Engine.server_args_class(**{**base, **kwargs})
