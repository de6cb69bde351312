"""Make sglang take its AMX CPU path on any x86 CPU (testing only).

sglang picks its CPU kernels with ``cpu_has_amx_support()``, which requires
``torch.cpu._is_amx_tile_supported()``, read ONCE when
``sglang.srt.utils.common`` is imported. Without it, ``--attention-backend
intel_amx`` silently falls back to ``torch_native``, which cannot run
speculative TARGET_VERIFY batches, and every layer takes a different code path
than on an AMX server.

With ``LOOKAHEAD_CPU_FORCE_AMX=1``, this file (imported by Python at start-up
because its directory is on ``PYTHONPATH``) installs an import hook that sets
``sglang.srt.utils.common.is_amx_tile_supported = True`` right after that
module executes, so every sglang process (launch_server, Engine, schedulers)
sees one consistent answer. Kernels then come from the pure-torch
``sgl_kernel`` next to this file. Any other ``sitecustomize`` on ``sys.path``
still runs afterwards.

With ``LOOKAHEAD_CPU_TORCH_SPEC_GATHER=1`` as well, the same hook replaces
``sglang.kernels.ops.speculative.gather_spec_extras.gather_spec_extras``
(a Triton row gather that EAGLE's overlap scheduling runs, and which has no
CPU driver) with its pure-torch equivalent, before ``overlap_utils`` binds it.
SGLang turns overlap off for EAGLE on CPU; the tests that lift that guard to
exercise the overlap path of LOOKAHEAD + EAGLE set this variable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_TARGET = "sglang.srt.utils.common"
_ENV = "LOOKAHEAD_CPU_FORCE_AMX"
_GATHER_TARGET = "sglang.kernels.ops.speculative.gather_spec_extras"
_GATHER_ENV = "LOOKAHEAD_CPU_TORCH_SPEC_GATHER"


def _torch_gather_spec_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    """``gather_spec_extras`` without Triton: the same rows of every buffer."""
    idx = indices.long()
    hidden = hidden_states_buf[idx] if hidden_states_buf is not None else None
    return topk_p_buf[idx], topk_index_buf[idx], output_tokens_buf[idx], hidden


def _patch(module) -> None:
    if module.__name__ == _TARGET:
        module.is_amx_tile_supported = True
    elif module.__name__ == _GATHER_TARGET:
        module.gather_spec_extras = _torch_gather_spec_extras


class _ForceAmxFinder(importlib.abc.MetaPathFinder):
    """Delegates the import of ``_TARGET`` and patches the module afterwards."""

    lookahead_force_amx = True  # marker for idempotent install

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _targets():
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    """Wraps the real loader; everything but ``exec_module`` is delegated."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _patch(module)


def _targets() -> tuple:
    return (_TARGET, _GATHER_TARGET) if os.environ.get(_GATHER_ENV) == "1" else (_TARGET,)


def install() -> bool:
    """Install the hook in this process (idempotent). Returns False when
    ``_TARGET`` was already imported, i.e. too late to be consistent."""
    if any(getattr(f, "lookahead_force_amx", False) for f in sys.meta_path):
        return True
    if _TARGET in sys.modules:
        return False
    sys.meta_path.insert(0, _ForceAmxFinder())
    return True


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    if os.environ.get(_ENV) == "1":
        install()
    _chain_next_sitecustomize()
