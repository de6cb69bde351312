"""KV-cache bookkeeping ops: slot tables and row copies.

sglang keeps, per request, a row of ``req_to_token`` (int32) mapping token
positions to KV-cache slots. The CPU engine fills and reads those rows with the
``assign_*`` ops below (``mem_cache/allocation.py``,
``kernels/ops/speculative/cache_locs.py``), stores K/V rows with
``store_cache_cpu`` and moves whole slots across every layer with
``copy_all_layer_kv_cache_cpu`` (called once at pool start-up as a warm-up).
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch


def _ragged_columns(start: torch.Tensor, end: torch.Tensor):
    """For requests with column ranges ``[start, end)``: (request id, column)
    per element, request-major, i.e. the packed order sglang uses.

    In numpy: these run several times per decode step, and a handful of
    small torch ops cost more than the step's own bookkeeping should."""
    start = start.numpy().astype(np.int64, copy=False)
    lens = np.maximum(end.numpy().astype(np.int64, copy=False) - start, 0)
    req = np.repeat(np.arange(lens.size), lens)
    first = np.cumsum(lens) - lens
    cols = start[req] + np.arange(req.size) - first[req]
    return torch.from_numpy(req), torch.from_numpy(cols)


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write packed ``out_cache_loc`` into ``req_to_token[req, start:end]`` rows."""
    req, cols = _ragged_columns(start_offset, end_offset)
    rows = req_pool_indices.long()[req]
    req_to_token[rows, cols] = out_cache_loc[: req.numel()].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather ``req_to_token[req, start:end]`` rows, packed, into ``out_cache_loc``."""
    req, cols = _ragged_columns(start_offset, end_offset)
    rows = req_pool_indices.long()[req]
    out_cache_loc[: req.numel()] = req_to_token[rows, cols].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Gather each request's ``topk * num_steps`` slots from ``seq_lens`` on."""
    width = topk * num_steps
    start = seq_lens.long()
    assign_extend_cache_locs_cpu(
        req_pool_indices, req_to_token, start, start + width, out_cache_loc, pool_len
    )


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """A ``[bs * topk, pool_len]`` table: each row is its request's prefix
    followed by that candidate's ``num_steps`` draft slots (EAGLE drafts)."""
    bs = req_pool_indices.numel()
    out = torch.empty((bs * topk, pool_len), dtype=req_to_token.dtype)
    for b, (pool, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        src = req_to_token[pool]
        for t in range(topk):
            row = out[b * topk + t]
            row[:length] = src[:length]
            begin = length + t * num_steps
            row[length : length + num_steps] = src[begin : begin + num_steps]
    return out


def store_cache_cpu(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    row_dim: int,
) -> None:
    """``k_cache[indices] = k`` and ``v_cache[indices] = v``, rows of ``row_dim``."""
    idx = indices.long()
    k_cache.view(-1, row_dim)[idx] = k.reshape(-1, row_dim).to(k_cache.dtype)
    v_cache.view(-1, row_dim)[idx] = v.reshape(-1, row_dim).to(v_cache.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer (raw address ``data_ptrs[i]``, row size ``strides[i]``
    bytes), copy row ``src_loc[j]`` to row ``tgt_loc[j]``.

    All source rows are read before any target row is written, so overlapping
    source/target sets behave like the real kernel's gather-then-scatter.
    """
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.long().numpy()
    src = src_loc.long().numpy()
    rows = int(max(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        table = np.frombuffer(raw, dtype=np.uint8).reshape(rows, stride)
        table[tgt] = table[src]
