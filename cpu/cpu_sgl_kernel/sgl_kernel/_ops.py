"""Register the pure-torch kernels as ``torch.ops.sgl_kernel.*``.

sglang calls the CPU kernels through the dispatcher (``torch.ops.sgl_kernel.X``)
and detects the "AMX" path by ``hasattr(torch.ops.sgl_kernel,
"convert_weight_packed")``, so the names must exist there, not only as Python
functions. Schemas follow the call sites in sglang 0.5.23 (argument order and
``Optional``-ness), with ``(a!)`` marking every tensor an op writes.
"""

from __future__ import annotations

import os

import torch

from . import attention, gemm, kvcache, norm_act, sampling, speculative

# name -> (schema after the name, implementation)
_OPS = {
    # --- dense model layers (taken when sglang believes the CPU has AMX)
    "convert_weight_packed": ("(Tensor weight) -> Tensor", gemm.convert_weight_packed),
    "weight_packed_linear": (
        "(Tensor mat1, Tensor mat2, Tensor? bias, bool is_vnni) -> Tensor",
        gemm.weight_packed_linear,
    ),
    "rmsnorm_cpu": ("(Tensor input, Tensor weight, float eps) -> Tensor", norm_act.rmsnorm_cpu),
    "fused_add_rmsnorm_cpu": (
        "(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps) -> ()",
        norm_act.fused_add_rmsnorm_cpu,
    ),
    "silu_and_mul_cpu": ("(Tensor input) -> Tensor", norm_act.silu_and_mul_cpu),
    "gelu_and_mul_cpu": ("(Tensor input) -> Tensor", norm_act.gelu_and_mul_cpu),
    "gelu_tanh_and_mul_cpu": ("(Tensor input) -> Tensor", norm_act.gelu_tanh_and_mul_cpu),
    "rotary_embedding_cpu": (
        "(Tensor positions, Tensor query, Tensor key, int head_size, Tensor cos_sin_cache, "
        "bool is_neox) -> (Tensor, Tensor)",
        norm_act.rotary_embedding_cpu,
    ),
    # --- attention (intel_amx backend) and KV cache
    "decode_attention_cpu": (
        "(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float k_scale, float v_scale, "
        "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, "
        "float logit_cap, bool is_cross_attention, int sliding_window, Tensor? encoder_lens, "
        "Tensor? sinks) -> ()",
        attention.decode_attention_cpu,
    ),
    "extend_attention_cpu": (
        "(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
        "Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, "
        "Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
        "bool is_cross_attention, int sliding_window, Tensor? encoder_lens, Tensor? sinks, "
        "Tensor? tree_mask, bool is_causal) -> ()",
        attention.extend_attention_cpu,
    ),
    "store_cache_cpu": (
        "(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor indices, "
        "int row_dim) -> ()",
        kvcache.store_cache_cpu,
    ),
    # --- speculative decoding (also importable as Python functions)
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, "
        "Tensor retrive_next_sibling, Tensor target_predict) -> ()",
        speculative.verify_tree_greedy_cpu,
    ),
    "reconstruct_indices_from_tree_mask": (
        "(Tensor tree_mask, Tensor verified_seq_len, Tensor(a!) positions, "
        "Tensor(b!) retrive_index, Tensor(c!) retrive_next_token, "
        "Tensor(d!) retrive_next_sibling, int batch_size, int draft_token_num) -> ()",
        speculative.reconstruct_indices_from_tree_mask,
    ),
    "tree_speculative_sampling_target_only": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, "
        "Tensor retrive_next_sibling, Tensor uniform_samples, "
        "Tensor uniform_samples_for_final_sampling, Tensor target_probs, "
        "Tensor(d!) draft_probs, float threshold_single=1.0, float threshold_acc=1.0, "
        "bool deterministic=True) -> ()",
        sampling.tree_speculative_sampling_target_only,
    ),
    # --- seeded sampling
    "murmur_hash32_cpu": (
        "(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor",
        sampling.murmur_hash32_cpu,
    ),
}

# Ops without tensor arguments need a backend-independent kernel.
_TENSORLESS_OPS = {
    "initialize": "(int size, int rank) -> ()",
    "init_cpu_threads_env": "(str cpu_ids) -> str",
}


def initialize(size: int, rank: int) -> None:
    """Shared-memory all-reduce setup for CPU tensor parallelism: a no-op here
    (single rank); more than one rank is not supported by this shim."""
    if size != 1:
        raise NotImplementedError("cpu sgl_kernel shim: shared-memory all-reduce (tp > 1)")


def init_cpu_threads_env(cpu_ids: str) -> str:
    """The real kernel pins OpenMP threads to ``cpu_ids`` ("0-3,8" style).
    Pinning would make concurrent test servers fight over the same cores, so
    only the thread count is adopted (capped by the cores this process may use)."""
    count = 0
    for part in filter(None, cpu_ids.split(",")):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    count = max(1, min(count, len(os.sched_getaffinity(0))))
    torch.set_num_threads(count)
    return f"cpu sgl_kernel shim: {count} torch threads, no pinning ({cpu_ids})"


def register() -> None:
    """Define every op once per process (idempotent, also across re-imports).

    The ``Library`` object is parked on the ``torch.ops.sgl_kernel`` namespace:
    registrations vanish when it is garbage-collected, and this module may be
    dropped from ``sys.modules`` and imported again (test isolation).
    """
    namespace = torch.ops.sgl_kernel
    if getattr(namespace, "_cpu_shim_library", None) is not None:
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name, (schema, fn) in _OPS.items():
        if not hasattr(namespace, name):
            lib.define(name + schema)
            lib.impl(name, fn, "CPU")
    impls = {"initialize": initialize, "init_cpu_threads_env": init_cpu_threads_env}
    for name, schema in _TENSORLESS_OPS.items():
        if not hasattr(namespace, name):
            lib.define(name + schema)
            lib.impl(name, impls[name], "CompositeExplicitAutograd")
    namespace._cpu_shim_library = lib
