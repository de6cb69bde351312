"""Norms, gated activations and rotary embedding for sglang's AMX CPU path.

When sglang believes the CPU has AMX, ``RMSNorm.forward_cpu``,
``SiluAndMul.forward_cpu`` and ``RotaryEmbedding.forward_cpu`` call these ops
instead of their ``forward_native`` bodies. Each one computes in float32 and
returns (or writes back) the input dtype, like the real kernels.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return x * weight.to(torch.float32)


def rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``RMSNorm(input) * weight``, a new tensor in ``input``'s dtype."""
    return _rms(input, weight, eps).to(input.dtype)


def fused_add_rmsnorm_cpu(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place: ``residual += input``, then ``input = RMSNorm(residual) * weight``.

    sglang returns ``(input, residual)`` after the call, so both are mutated.
    """
    summed = input.to(torch.float32) + residual.to(torch.float32)
    residual.copy_(summed)
    input.copy_(_rms(summed, weight, eps))


def silu_and_mul_cpu(input: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2``."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    return (F.silu(x[..., :d]) * x[..., d:]).to(input.dtype)


def gelu_and_mul_cpu(input: torch.Tensor) -> torch.Tensor:
    """``gelu(x[..., :d]) * x[..., d:]`` (erf form)."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    return (F.gelu(x[..., :d]) * x[..., d:]).to(input.dtype)


def gelu_tanh_and_mul_cpu(input: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]``."""
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    return (F.gelu(x[..., :d], approximate="tanh") * x[..., d:]).to(input.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool):
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def _rope_one(x, positions, head_size, cos, sin, is_neox):
    shape = x.shape
    x = x.reshape(positions.numel(), -1, head_size).to(torch.float32)
    rot = cos.shape[-1] * 2
    x_rot = _rotate(x[..., :rot], cos, sin, is_neox)
    return torch.cat((x_rot, x[..., rot:]), dim=-1).reshape(shape)


def rotary_embedding_cpu(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotary embedding; returns new ``(query, key)`` in their input shapes.

    ``cos_sin_cache[pos]`` is ``[cos | sin]`` over the rotary dims, which may be
    fewer than ``head_size`` (partial rotary: the tail passes through).
    """
    positions = positions.flatten()
    cos, sin = cos_sin_cache.index_select(0, positions).to(torch.float32).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    q = _rope_one(query, positions, head_size, cos, sin, is_neox).to(query.dtype)
    if key is None:
        return q, None
    k = _rope_one(key, positions, head_size, cos, sin, is_neox).to(key.dtype)
    return q, k
