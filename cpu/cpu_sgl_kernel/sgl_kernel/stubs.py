"""Names sglang looks up at import time that this shim does not implement.

sglang modules bind many ``sgl_kernel`` names when they are imported, on code
paths a dense model never runs (MoE, Mamba, multimodal, EAGLE drafting...). If a
name is missing, the importing module fails to load; sglang then silently drops
every model class defined there (e.g. ``llama.py`` falls back to the
Transformers backend). Each name below is therefore bound to a function that
raises ``NotImplementedError`` only when actually called.

Capability probes such as ``hasattr(torch.ops.sgl_kernel,
"fused_qk_norm_cpu")`` are deliberately NOT stubbed: their absence selects
sglang's generic code path.
"""

from __future__ import annotations

import torch

# ``from sgl_kernel[.sub] import X`` in sglang's CPU branches (module level).
PYTHON_STUBS = {
    "sgl_kernel": [
        "rotate_input_ids_cpu",  # multi-layer EAGLE
    ],
    "sgl_kernel.mamba": [  # hybrid linear-attention models (Qwen3-Next, Kimi)
        "causal_conv1d_fn_cpu",
        "causal_conv1d_update_cpu",
        "chunk_gated_delta_rule_cpu",
    ],
}

# Every other ``torch.ops.sgl_kernel.X`` that sglang 0.5.23 names, minus the
# ops implemented in ``_ops`` and the capability probes (fused_qk_norm_cpu,
# fused_qk_norm_rope_cpu, gdn_attention, shm_group_initialize,
# apply_gguf_moe_weights, get_device_accessible_ptr), which must stay absent.
OP_STUBS = [
    "apply_multidimensional_rope_cpu",
    "apply_rotary_pos_emb_cpu",
    "biased_grouped_topk_cpu",
    "bmm_cpu",
    "causal_conv1d_weight_pack",
    "conv3d_embed_cpu",
    "conv3d_embed_weight_pack",
    "convert_scale_packed",
    "convert_weight_packed_scale_zp",
    "deepseek_v4_topk_transform_512",
    "dsv4_fused_q_indexer_rope_hadamard_quant",
    "flash_attn_varlen_func",
    "fp8_per_tensor_scaled_mm_cpu",
    "fp8_scaled_mm_cpu",
    "fused_dual_residual_rmsnorm_cpu",
    "fused_experts_cpu",
    "fused_gdn_gating_cpu",
    "fused_input_proj_cpu",
    "fused_linear_sigmoid_mul",
    "fused_moe_router_cpu",
    "fused_norm_scale_shift_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qk_rmsnorm_apply_from_stats_cpu",
    "fused_qk_rmsnorm_cpu",
    "fused_qk_rmsnorm_sumsq_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    "fused_qkvzba_split_reshape_cat_cpu",
    "fused_rmsnorm_gated_cpu",
    "fused_scale_residual_norm_scale_shift",
    "fused_scale_residual_norm_scale_shift_cpu",
    "fused_scale_shift_cpu",
    "fused_sigmoid_gating_delta_rule_update_cpu",
    "fused_sigmoid_mul_cpu",
    "gemma3_rmsnorm_cpu",
    "gemma4_rmsnorm_cpu",
    "gemma_fused_add_rmsnorm_cpu",
    "gemma_rmsnorm_cpu",
    "grouped_topk_cpu",
    "image_preprocess_cpu",
    "int4_scaled_mm_cpu",
    "int8_scaled_mm_with_quant",
    "l2norm_cpu",
    "layernorm_cpu",
    "multimodal_rotary_embedding_cpu",
    "qkv_proj_with_rope_fused_weight",
    "query_device",
    "rotary_embedding",
    "shared_expert_cpu",
    "shm_allgather",
    "shm_allreduce",
    "shm_alltoall",
    "topk_sigmoid_cpu",
    "topk_softmax_cpu",
    "topk_transform",
    "topk_transform_paged",
    "topk_transform_ragged",
]

# Names that must never be stubbed: sglang tests for their presence.
CAPABILITY_PROBES = [
    "apply_gguf_moe_weights",
    "fused_qk_norm_cpu",
    "fused_qk_norm_rope_cpu",
    "gdn_attention",
    "get_device_accessible_ptr",
    "shm_group_initialize",
]


def make_stub(qualified_name: str):
    """A function that raises a clear error naming the unimplemented kernel."""

    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"{qualified_name} is not implemented by the pure-torch CPU sgl_kernel "
            "shim (cpu/cpu_sgl_kernel): sglang reached a code path "
            "(model type or feature) that this test shim does not cover"
        )

    stub.__name__ = stub.__qualname__ = qualified_name.rsplit(".", 1)[-1]
    stub.is_cpu_shim_stub = True
    return stub


def install_op_stubs() -> None:
    """Bind raising stubs on ``torch.ops.sgl_kernel`` for names not registered."""
    namespace = torch.ops.sgl_kernel
    for name in OP_STUBS:
        if not hasattr(namespace, name):
            setattr(namespace, name, make_stub(f"torch.ops.sgl_kernel.{name}"))


def module_stubs(module_name: str) -> dict:
    """Stub functions for ``module_name`` (``"sgl_kernel"`` or a submodule)."""
    return {name: make_stub(f"{module_name}.{name}") for name in PYTHON_STUBS.get(module_name, [])}
