"""Pure-torch stand-in for ``sgl_kernel`` on a CUDA machine without it (testing only).

``tools/gpu_bare_machine.sh`` runs real SGLang on a GPU where neither
sglang-kernel nor flashinfer is installed (our lent machine reaches no
package registry and has no wheel of either for its torch). With
``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` SGLang's own layers run their
``forward_native``, so very little of this package is ever called: RMSNorm
and the activations below (the CPU stand-in's torch bodies under the CUDA
signatures), ``is_arch_support_pdl`` and ``weak_ref_tensor``.
Everything else a module binds at import time is a stub that raises when
called, so a path this stand-in does not cover fails loudly, never silently.
Names SGLang probes for inside ``try`` (capability checks) are left out, so
that their fast paths stay off. Unlike ``cpu_sgl_kernel``, it registers no
``torch.ops.sgl_kernel`` op: ``convert_weight_packed`` there would make
SGLang take its AMX CPU branches on an AMX host.
"""

from __future__ import annotations

import lookahead_bare_gpu_ops as torch_ops
import torch

from . import flash_attn, kvcacheio, quantization, scalar_type, speculative, utils  # noqa: F401 - submodules SGLang imports from
from ._stubs import stub

__version__ = "0.0.0+bare-gpu"
IS_BARE_GPU_STANDIN = True
top_k_renorm_prob = torch_ops.top_k_renorm_prob
top_p_renorm_prob = torch_ops.top_p_renorm_prob


# The CUDA kernels' signatures around the CPU stand-in's torch bodies, which
# compute in float32 on the inputs' device.
def _into(out, result):
    if out is None:
        return result
    out.copy_(result)
    return out


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _into(out, torch_ops.rmsnorm_cpu(input, weight, eps))


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """In place on both, as the CUDA kernel: residual += input; input = rms(residual)."""
    torch_ops.fused_add_rmsnorm_cpu(input, residual, weight, eps)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return rmsnorm(input, weight + 1.0, eps, out)


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    fused_add_rmsnorm(input, residual, weight + 1.0, eps)


def silu_and_mul(input, out=None, enable_pdl=None):
    return _into(out, torch_ops.silu_and_mul_cpu(input))


def gelu_and_mul(input, out=None, enable_pdl=None):
    return _into(out, torch_ops.gelu_and_mul_cpu(input))


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    return _into(out, torch_ops.gelu_tanh_and_mul_cpu(input))


def weak_ref_tensor(tensor):
    """A view of ``tensor``'s memory that does not keep it alive (breakable
    CUDA graphs hand these to captured segments)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        return tensor
    nbytes = tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size()
    storage = torch._C._construct_storage_from_data_pointer(tensor.data_ptr(), tensor.device, nbytes)
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(storage, 0, tensor.size(), tensor.stride())


# Bound at import time by modules of paths a dense model never runs (MoE,
# quantization, MLA, DeepSeek V4, XPU, the CPU engine...).
_STUBBED = [
    "apply_token_bitmask_inplace_cuda", "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu", "build_tree_kernel_efficient", "build_tree_kernel_efficient_cpu",
    "compress_norm_rope_store", "concat_mla_k", "copy_all_layer_kv_cache_cpu", "cutlass_w4a8_moe_mm",
    "es_fp8_blockwise_scaled_grouped_mm", "es_sm100_mxfp8_blockscaled_grouped_mm",
    "es_sm100_mxfp8_blockscaled_grouped_quant", "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu",
    "flash_compress128_decode", "flash_compress128_prefill", "flash_compress4_decode", "flash_compress4_prefill",
    "flash_mla_decode", "flash_mla_decode_get_workspace_size", "flash_mla_prefill",
    "flash_mla_prefill_get_workspace_size", "fp8_blockwise_scaled_grouped_mm", "fp8_mqa_logits",
    "fp8_paged_mqa_logits", "fused_inplace_qknorm_rope", "fused_k_norm_rope_flashmla", "fused_q_norm_rope",
    "gelu_quick", "get_cutlass_w4a8_moe_mm_data", "infllmv2_attn_stage1", "int8_scaled_mm",
    "load_cache_to_device_buffer_dsv4_mla", "load_cache_to_device_buffer_mla", "max_pooling_1d_varlen",
    "merge_state_v2", "min_p_sampling_from_probs", "moe_sum", "moe_sum_reduce", "plan_compress_decode",
    "plan_compress_decode_legacy", "plan_compress_prefill", "plan_compress_prefill_legacy", "rotate_input_ids_cpu",
    "sgl_per_tensor_quant_fp8", "sgl_per_token_quant_fp8", "shuffle_rows", "store_cache_xpu",
    "top_k_top_p_sampling_from_probs", "topk_sigmoid", "topk_softmax", "verify_tree_greedy_cpu",
]
globals().update({name: stub(f"sgl_kernel.{name}") for name in _STUBBED})
