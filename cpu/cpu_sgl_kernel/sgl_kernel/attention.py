"""Paged attention for sglang's ``intel_amx`` CPU backend, in plain torch.

sglang's ``IntelAMXAttnBackend`` calls two ops (see
``sglang/srt/layers/attention/intel_amx_backend.py``):

* ``decode_attention_cpu``: one query token per request. The kernel itself
  writes the new K/V rows into the paged cache at ``loc`` (when ``key`` and
  ``value`` are given), then attends over the request's first ``seq_lens[i]``
  slots of ``req_to_token``.
* ``extend_attention_cpu``: ``extend_seq_lens[i]`` query tokens per request that
  follow a cached prefix of ``seq_lens[i] - extend_seq_lens[i]`` tokens. The
  backend has already stored the new K/V (``k_extend``/``v_extend``) in the
  cache, so all keys are read from there. It also serves speculative
  TARGET_VERIFY batches: there ``tree_mask`` holds, per request, an ``n x n``
  bool matrix (flat, row-major, ``mask[i, j]`` = draft token ``i`` may see
  draft token ``j``) that replaces the causal mask among the draft tokens;
  the prefix stays fully visible.

Math is done in float32 and written into ``o`` in its own dtype. Loops run per
request: the batches these tests serve are small, and clarity beats speed here.
"""

from __future__ import annotations

from typing import Optional

import torch

_FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


def _load(buffer: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """Rows of a paged K or V buffer as float32, dequantised by ``scale``."""
    x = buffer[rows].to(torch.float32)
    if scale != 1.0 or buffer.dtype in _FP8_DTYPES:
        x = x * scale
    return x


def _as_heads(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """View ``x`` as ``[tokens, heads, dim]`` with the head layout of ``like``."""
    return x.reshape(-1, like.shape[-2], like.shape[-1])


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Masked softmax attention with grouped KV heads, returned in float32.

    q ``[M, H, D]``, k ``[L, Hkv, D]``, v ``[L, Hkv, Dv]``, visible ``[M, L]``
    bool. ``logit_cap > 0`` applies ``cap * tanh(s / cap)``; ``sinks`` (one
    logit per head) joins every softmax denominator without a value row.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    k = k.to(torch.float32).repeat_interleave(group, dim=1)
    v = v.to(torch.float32).repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,lhd->hml", q.to(torch.float32), k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    scores = scores.masked_fill(~visible.unsqueeze(0), float("-inf"))
    if sinks is not None:
        sink = sinks.to(torch.float32).view(num_heads, 1, 1).expand(-1, q.shape[0], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hml,lhd->mhd", probs, v)


def _window(visible: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int):
    """Apply a sliding window: ``window > 0`` keeps keys with ``q - k < window``."""
    if window > 0:
        visible &= (q_pos[:, None] - k_pos[None, :]) < window
    return visible


def _reject_cross_attention(is_cross_attention: bool) -> None:
    if is_cross_attention:
        raise NotImplementedError(
            "cpu sgl_kernel shim: cross-attention (encoder_lens) is not implemented"
        )


def decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: Optional[torch.Tensor],
    value: Optional[torch.Tensor],
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window: int,
    encoder_lens: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
) -> None:
    """One decode step: store the new K/V at ``loc``, attend, write ``output``.

    ``sliding_window`` is the layer's window + 1 (0 = no window);
    ``attn_logits`` is the real kernel's split-K scratch and is unused here.
    """
    _reject_cross_attention(is_cross_attention)
    if key is not None and value is not None:
        k_cache[loc] = _as_heads(key, k_cache).to(k_cache.dtype)
        v_cache[loc] = _as_heads(value, v_cache).to(v_cache.dtype)

    bs = seq_lens.numel()
    out = output.view(bs, -1, v_cache.shape[-1])
    q = query.reshape(bs, out.shape[1], -1)
    lens = seq_lens.tolist()
    pools = req_pool_indices.tolist()
    for i, (seq_len, pool) in enumerate(zip(lens, pools)):
        rows = req_to_token[pool, :seq_len].long()
        k = _load(k_cache, rows, k_scale)
        v = _load(v_cache, rows, v_scale)
        visible = torch.ones(1, seq_len, dtype=torch.bool)
        if sliding_window > 0:
            visible = _window(visible, torch.tensor([seq_len - 1]), torch.arange(seq_len), sliding_window)
        result = attend(q[i : i + 1], k, v, visible, sm_scale, logit_cap, sinks)
        out[i] = result[0].to(out.dtype)


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: Optional[torch.Tensor],
    v_extend: Optional[torch.Tensor],
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window: int,
    encoder_lens: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    tree_mask: Optional[torch.Tensor],
    is_causal: bool,
) -> None:
    """Prefill/extend (and tree verify) attention over prefix + new tokens.

    ``tree_mask`` layouts accepted (per request, concatenated): ``n x n``
    (draft block only; what sglang's CPU NGRAM path passes) or
    ``n x (prefix + n)`` (the CUDA "full mask" with the prefix columns).
    """
    _reject_cross_attention(is_cross_attention)
    lens = seq_lens.tolist()
    ext_lens = extend_seq_lens.tolist()
    starts = extend_start_loc.tolist()
    pools = req_pool_indices.tolist()
    # One query per request (a width-1 verify) needs no tree: a node sees itself.
    tree = _split_tree_mask(tree_mask, lens, ext_lens) if max(ext_lens, default=0) > 1 else None

    for i, (seq_len, ext, start, pool) in enumerate(zip(lens, ext_lens, starts, pools)):
        if ext == 0:
            continue
        prefix = seq_len - ext
        # The backend has stored this step's K/V in the cache before the call
        # (``IntelAMXAttnBackend.forward_extend``), so every key is read from
        # the cache, as the decode op reads it: one gather, no concatenation.
        rows = req_to_token[pool, :seq_len].long()
        k, v = _load(k_buffer, rows, k_scale), _load(v_buffer, rows, v_scale)
        if ext == 1 and is_causal and sliding_window <= 0:
            # One query at the end (a width-1 verify, or a one-token extend):
            # decode's mask, every key visible; a tree of one node is itself.
            visible = torch.ones(1, seq_len, dtype=torch.bool)
        else:
            q_pos = torch.arange(prefix, seq_len)
            k_pos = torch.arange(seq_len)
            if is_causal:
                visible = k_pos[None, :] <= q_pos[:, None]
            else:
                visible = torch.ones(ext, seq_len, dtype=torch.bool)
            if tree is not None:
                visible[:, prefix:] = tree[i]
            visible = _window(visible, q_pos, k_pos, sliding_window)

        out = attend(q_extend[start : start + ext], k, v, visible, sm_scale, logit_cap, sinks)
        o_extend[start : start + ext] = out.to(o_extend.dtype)


def _split_tree_mask(tree_mask, lens, ext_lens):
    """Per-request ``[ext, ext]`` draft-visibility blocks from a flat mask."""
    if tree_mask is None or tree_mask.numel() == 0:
        return None
    flat = tree_mask.reshape(-1).to(torch.bool)
    qlen_only = sum(e * e for e in ext_lens)
    full = sum(e * s for e, s in zip(ext_lens, lens))
    blocks, offset = [], 0
    if flat.numel() == full:  # equals qlen_only when no prefix: same layout
        for e, s in zip(ext_lens, lens):
            blocks.append(flat[offset : offset + e * s].view(e, s)[:, s - e :])
            offset += e * s
    elif flat.numel() >= qlen_only:
        for e in ext_lens:
            blocks.append(flat[offset : offset + e * e].view(e, e))
            offset += e * e
    else:
        raise ValueError(
            f"tree_mask has {flat.numel()} entries; expected {qlen_only} (n x n per "
            f"request) or {full} (n x (prefix + n) per request)"
        )
    return blocks
