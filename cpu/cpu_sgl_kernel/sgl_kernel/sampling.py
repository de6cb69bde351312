"""Sampling-based tree verification and top-k/top-p renormalisation.

sglang 0.5.23 never calls these on CPU: ``eagle_utils._verify_uses_greedy``
forces argmax verification whenever ``is_cpu()``, even at temperature > 0, and
``verify_sampling.tree_speculative_sampling_target_only`` / ``renorm.top_*``
resolve to ``None`` there. A worker that wants distribution-preserving
speculative sampling on CPU can call them directly; they follow the CUDA
kernel (``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``)
and FlashInfer's renorm semantics.
"""

from __future__ import annotations

from typing import Union

import torch


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Tree speculative sampling for deterministic drafts, in place.

    Shapes: candidates/retrive_* ``[bs, n]``; uniform_samples ``[bs, n]``;
    uniform_samples_for_final_sampling ``[bs]``; target_probs/draft_probs
    ``[bs, n, vocab]`` (draft_probs zeros on entry; rejected candidates' target
    mass is recorded in it, as the kernel does).

    At each level the children of the current node are tried in sibling order
    against one coin ``u`` (the coin of the node whose distribution is used):
    child ``c`` with token ``x`` is accepted when ``p(x) > 0`` and
    ``u < (p(x_1) + ... + p(x)) / threshold_acc`` or ``p(x) >= threshold_single``
    (sums reset after each acceptance). With both thresholds at 1 this is
    inverse-CDF sampling of ``p`` restricted to the children, so a child is
    accepted with exactly its target probability. If no child is accepted (or
    ``accept_index.shape[1] - 1`` drafts were), the final token is sampled from
    ``relu(p - draft_probs)`` (rejected children removed) with the final coin.
    """
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    vocab = target_probs.shape[-1]
    cand = candidates.tolist()
    index = retrive_index.tolist()
    next_token = retrive_next_token.tolist()
    next_sibling = retrive_next_sibling.tolist()
    coins = uniform_samples.reshape(bs, n).tolist()
    final_coins = uniform_samples_for_final_sampling.reshape(-1).tolist()
    target = target_probs.view(bs, n, vocab)
    draft = draft_probs.view(bs, n, vocab)

    for b in range(bs):
        row = 0  # node whose target distribution is being sampled
        coin = coins[b][0]
        prob_acc = 0.0
        last = index[b][0]
        path = [last]
        cur = 0
        for _ in range(1, steps):
            cur = next_token[b][cur]
            while cur != -1:
                token = cand[b][cur]
                p = float(target[b, row, token])
                prob_acc += p
                if p > 0 and (coin < prob_acc / threshold_acc or p >= threshold_single):
                    prob_acc = 0.0
                    row, coin = cur, coins[b][cur]
                    predicts[last] = token
                    last = index[b][cur]
                    path.append(last)
                    break
                draft[b, row, token] = target[b, row, token]
                cur = next_sibling[b][cur]
            if cur == -1:
                break
        accept_index[b, : len(path)] = torch.tensor(path, dtype=accept_index.dtype, device=accept_index.device)
        accept_token_num[b] = len(path) - 1

        q = target[b, row].to(torch.float32)
        if len(path) - 1 != steps - 1:  # the bonus slot has no draft distribution
            q = (q - draft[b, row].to(torch.float32)).clamp_(min=0)
        predicts[last] = _sample_from_unnormalised(q, final_coins[b], vocab)


def _sample_from_unnormalised(weights: torch.Tensor, coin: float, vocab: int) -> int:
    """First index whose inclusive cumulative weight exceeds ``coin * total``;
    if rounding leaves none, the last positive entry (else ``vocab - 1``)."""
    cdf = torch.cumsum(weights, 0)
    u = coin * float(cdf[-1])
    hit = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype, device=cdf.device), right=True))
    if hit < vocab and float(weights[hit]) > 0:
        return hit
    positive = torch.nonzero(weights > 0)
    return int(positive[-1]) if positive.numel() else vocab - 1


def _per_row(value: Union[torch.Tensor, int, float], rows: int, dtype, device=None) -> torch.Tensor:
    """A scalar or per-row parameter (int/float or tensor) as a ``[rows]`` tensor."""
    if not isinstance(value, torch.Tensor):
        return torch.full((rows,), value, dtype=dtype, device=device)
    flat = value.reshape(-1).to(device=device, dtype=dtype)
    return flat.expand(rows) if flat.numel() == 1 else flat


def top_k_renorm_prob(probs: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """Keep each row's entries ``>=`` its k-th largest value, renormalised.

    ``k <= 0`` or ``k >= vocab`` keeps the row unchanged (FlashInfer semantics;
    ties at the pivot are all kept).
    """
    rows, vocab = probs.shape
    k = _per_row(top_k, rows, torch.int64, probs.device)
    k_clamped = k.clamp(1, vocab)
    pivot = probs.sort(dim=-1, descending=True).values.gather(1, (k_clamped - 1)[:, None])
    keep = (probs >= pivot) | ((k <= 0) | (k >= vocab))[:, None]
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_p: Union[torch.Tensor, float]) -> torch.Tensor:
    """Keep each row's smallest top set with mass ``>= p``, renormalised.

    A token is kept when the mass of strictly more probable tokens is below
    ``p``, so ties at the boundary are kept together; ``p >= 1`` is a no-op.
    """
    rows, _ = probs.shape
    p = _per_row(top_p, rows, probs.dtype, probs.device)
    sorted_probs = probs.sort(dim=-1, descending=True).values
    mass_above = torch.cumsum(sorted_probs, -1) - sorted_probs
    cutoff_rank = (mass_above < p[:, None]).sum(-1, keepdim=True) - 1
    pivot = sorted_probs.gather(1, cutoff_rank.clamp(min=0))
    keep = (probs >= pivot) | (p >= 1)[:, None]
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


_MASK32 = 0xFFFFFFFF


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _murmur3_mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = (k * 0xCC9E2D51) & _MASK32  # int64 products wrap; the low 32 bits stay exact
    k = (_rotl32(k, 15) * 0x1B873593) & _MASK32
    h = _rotl32(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & _MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def murmur_hash32_cpu(
    seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor
) -> torch.Tensor:
    """``[n, m]`` uint32 MurmurHash3 of (seed low, seed high, position, column).

    Seeded sampling (``sampling_seed``) on CPU draws its uniforms from this
    (``sglang/kernels/ops/sampling/murmur_hash.py`` has the Triton original).
    """
    s = seed.to(torch.int64)  # uint64 bit pattern, wrapped into int64
    h = torch.zeros_like(s)
    h = _murmur3_mix(h, s & _MASK32)
    h = _murmur3_mix(h, (s >> 32) & _MASK32)
    h = _murmur3_mix(h, positions.to(torch.int64) & _MASK32)
    h = h[:, None].expand(-1, col_indices.numel())
    h = _murmur3_mix(h, (col_indices.to(torch.int64) & _MASK32)[None, :])
    return _fmix32(h ^ 16).to(torch.uint32)
