"""Patch SGLang's CUDA-only kernels to pure torch on a bare GPU machine (testing only).

With ``LOOKAHEAD_BARE_GPU=1`` and this directory first on ``PYTHONPATH``
(``tools/gpu_bare_machine.sh`` sets both), every Python process, the
scheduler's too, installs an import hook that patches SGLang modules right
after they execute. SGLang 0.5.23 compiles these kernels on first use
(tvm-ffi, nvcc, flashinfer's headers); on a machine without flashinfer or
sglang-kernel they cannot build, so they are replaced:

* the greedy and the sampled tree acceptance of the verify flow, and the
  tree reconstruction from a mask, by the CPU stand-in's torch versions
  (``lookahead_bare_gpu_ops``; outside CUDA graphs, so their host syncs are allowed);
* the KV-cache store by SGLang's own index-put fallback;
* the small-batch dual GEMM, which imports CUTLASS at model construction
  although it runs only on SM100, by its absence.

SGLang's fused layers (RMSNorm, activations, rotary embedding) take their
``forward_native`` through ``SGLANG_FORCE_FUSED_OP_BACKEND=torch``, set by the
script. Attention and everything else run SGLang's own Triton kernels.
Any other ``sitecustomize`` on ``sys.path`` still runs afterwards.
"""

from __future__ import annotations

import os
import sys

# The checkout's cpu/ folder holds import_patching.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cpu"))
import import_patching  # noqa: E402


def _patch_tree(module):
    from lookahead_bare_gpu_ops import verify_tree_greedy

    module.verify_tree_greedy = verify_tree_greedy


def _patch_reconstruct(module):
    from lookahead_bare_gpu_ops import reconstruct_indices_from_tree_mask

    module.reconstruct_indices_from_tree_mask = reconstruct_indices_from_tree_mask


def _patch_verify_sampling(module):
    from lookahead_bare_gpu_ops import tree_speculative_sampling_target_only

    module.tree_speculative_sampling_target_only = tree_speculative_sampling_target_only


def _patch_memory_pool(module):
    module.can_use_store_cache = lambda *args, **kwargs: False


def _patch_dual_gemm(module):
    module.DualGemm._select_mode = lambda self, *args, **kwargs: None


_PATCHES = {
    "sglang.kernels.ops.speculative.tree": _patch_tree,
    "sglang.kernels.ops.speculative.reconstruct_tree": _patch_reconstruct,
    "sglang.kernels.ops.speculative.verify_sampling": _patch_verify_sampling,
    "sglang.srt.mem_cache.memory_pool": _patch_memory_pool,
    "sglang.srt.layers.dual_gemm": _patch_dual_gemm,
}


if __name__ == "sitecustomize":
    if os.environ.get("LOOKAHEAD_BARE_GPU") == "1":
        import_patching.install(_PATCHES, "lookahead_bare_gpu")
    import_patching.chain_next_sitecustomize(os.path.dirname(__file__))
