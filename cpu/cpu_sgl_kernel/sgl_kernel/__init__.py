"""Pure-torch stand-in for ``sgl_kernel`` on CPU-only machines (testing only).

sglang 0.5.23's CPU engine imports ``sgl_kernel`` at module level, but the
PyPI wheel is CUDA-only and the CPU build is not published. This package
provides what a dense (Llama-style) model needs for plain decoding and for
tree-verified speculative decoding with the ``intel_amx`` attention backend:

* ``torch.ops.sgl_kernel.*`` kernels (``_ops``: attention, norms, rope, linear);
* the Python-level bookkeeping ops (``kvcache``, ``speculative``, ``sampling``);
* raising stubs for every other name sglang looks up at import time (``stubs``).

Put ``cpu/cpu_sgl_kernel`` first on ``PYTHONPATH`` (see
``cpu_env``). It is never meant to be used with a GPU.
"""

from __future__ import annotations

from . import _ops, stubs
from .kvcache import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
)
from .sampling import (
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
)
from .speculative import (
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    verify_tree_greedy_cpu,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "tree_speculative_sampling_target_only",
    "verify_tree_greedy_cpu",
]
__version__ = "0.0.0+cpu.shim"
IS_CPU_SHIM = True  # lets tests tell this package from a real sgl_kernel

_ops.register()
stubs.install_op_stubs()
globals().update(
    {k: v for k, v in stubs.module_stubs(__name__).items() if k not in globals()}
)
