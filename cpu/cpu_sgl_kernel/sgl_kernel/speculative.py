"""Token-tree bookkeeping and greedy verification for speculative decoding.

A verify batch holds, per request, ``n`` draft tokens laid out as a tree whose
node 0 is the last committed token. sglang describes the tree three ways:

* ``tree_mask[b, i, j]`` (flat bool): node ``j`` is ``i`` itself or an ancestor;
* ``retrive_next_token[b, i]``: first child of ``i`` (-1 if none);
* ``retrive_next_sibling[b, i]``: next node with the same parent (-1 if none);

and ``retrive_index[b, i] = b * n + i`` flattens nodes across the batch.
``reconstruct_indices_from_tree_mask`` derives the links (and positions) from
the mask (contract: ``sglang/kernels/ops/speculative/reconstruct_tree.py``);
``verify_tree_greedy_cpu`` walks them (``kernels/ops/speculative/spec_tree.py``).
The spelling ``retrive`` follows sglang's keyword arguments.
"""

from __future__ import annotations

from typing import Optional

import torch

from .sampling import tree_speculative_sampling_target_only  # noqa: F401  (re-export)


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Fill positions and tree links in place from an ancestor mask.

    Per request ``b`` and node ``t`` (``anc[i, j] = mask[i, j] and j < i``):
    ``positions = #anc[t] + verified_seq_len[b]``; ``parent = max j in anc[t]``;
    first child = ``min k > t with anc[k, t]``; next sibling = ``min k > t``
    with the same parent (-1 for a node without parent).
    """
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).to(torch.bool)
    node = torch.arange(n, device=tree_mask.device)
    anc = mask & (node[None, :] < node[:, None])  # [b, i, j]: j strict ancestor of i

    depth = anc.sum(-1)
    positions.view(bs, n).copy_(depth + verified_seq_len.view(bs, 1).to(torch.int64))
    retrive_index.copy_(torch.arange(bs * n, device=retrive_index.device).view(bs, n))

    parent = torch.where(anc, node, -1).amax(-1)  # [b, i]
    child_rows = torch.where(anc, node[:, None], n)  # [b, k, t]: k if anc[k, t]
    first_child = child_rows.amin(1)
    retrive_next_token.copy_(torch.where(first_child < n, first_child, -1))

    later = node[:, None] > node[None, :]  # [k, t]: k > t
    same_parent = (parent[:, :, None] == parent[:, None, :]) & later
    first_sibling = torch.where(same_parent, node[:, None], n).amin(1)
    has_sibling = (parent >= 0) & (first_sibling < n)
    retrive_next_sibling.copy_(torch.where(has_sibling, first_sibling, -1))


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree acceptance, in place (int32 ``predicts``/``accept_*``).

    From the root, repeatedly descend into the first child whose draft token
    equals the target's argmax at the current node; stop at a mismatch or after
    ``accept_index.shape[1] - 1`` accepted drafts. Writes the accepted node
    indices (root first) into ``accept_index[b]``, their count (root excluded)
    into ``accept_token_num[b]``, and the target token at every accepted node
    (including the bonus at the last one) into ``predicts[node]``. Entries not
    on the accepted path are left untouched.
    """
    bs, _ = candidates.shape
    steps = accept_index.shape[1]
    if candidates.shape[1] == 1:
        # Roots only (width-1 verify): each accepts its root and nothing more.
        roots = retrive_index[:, 0].long()
        accept_index[:, 0] = roots.to(accept_index.dtype)
        accept_token_num.zero_()
        predicts[roots] = target_predict.reshape(-1)[roots].to(predicts.dtype)
        return
    cand = candidates.tolist()
    index = retrive_index.tolist()
    next_token = retrive_next_token.tolist()
    next_sibling = retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()

    writes: dict[int, int] = {}
    for b in range(bs):
        last = index[b][0]
        path = [last]
        cur = 0
        for _ in range(1, steps):
            cur = next_token[b][cur]
            while cur != -1:
                if cand[b][cur] == target[last]:
                    writes[last] = target[last]
                    last = index[b][cur]
                    path.append(last)
                    break
                cur = next_sibling[b][cur]
            if cur == -1:
                break
        writes[last] = target[last]
        accept_index[b, : len(path)] = torch.tensor(path, dtype=accept_index.dtype, device=accept_index.device)
        accept_token_num[b] = len(path) - 1
    if writes:
        keys = torch.tensor(list(writes.keys()), dtype=torch.int64, device=predicts.device)
        predicts[keys] = torch.tensor(list(writes.values()), dtype=predicts.dtype, device=predicts.device)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[b * accept_stride + accept_lens[b] - 1]``
    (``accept_lens`` counts the bonus token, so it is the last accepted slot)."""
    bs = accept_lens.numel()
    idx = torch.arange(bs) * accept_stride + accept_lens.long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: Optional[int] = None,
) -> None:
    """Pack ``out_cache_loc[i]`` for every ``i = accept_index.flat[j] > -1``, in order,
    into the front of ``accept_out_cache_loc``.

    sglang 0.5.23 omits ``size`` (older sgl_kernel took it); all of
    ``accept_index`` is scanned then.
    """
    flat = accept_index.reshape(-1)
    if size is not None:
        flat = flat[:size]
    src = flat[flat > -1].long()
    accept_out_cache_loc[: src.numel()] = out_cache_loc[src].to(accept_out_cache_loc.dtype)


# TreeMaskMode values (sglang/kernels/ops/speculative/spec_tree.py).
_FULL_MASK, _QLEN_ONLY, _QLEN_ONLY_BITPACKING = 0, 1, 2


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """EAGLE's draft tree, in place: the contract of SGLang's Triton
    ``sgl_build_tree_kernel_efficient_triton`` (``spec_tree.py``), which
    ``tests/unit/test_cpu_kernels.py`` runs under ``TRITON_INTERPRET=1`` as the reference.

    Per request ``b`` the verify tree has ``n = draft_token_num`` nodes: node 0
    is the last committed token, node ``i >= 1`` the draft candidate
    ``selected_index[b, i - 1]`` (an index into EAGLE's candidate list). A
    candidate ``c``'s parent is the root when ``c // topk == 0``, else the
    candidate ``parent_list[b, c // topk]``, found among the selected ones (not
    found: the walk stops there, as in the kernel). Fills, like the kernel:

    * ``retrive_index[b, i] = b * n + i``; ``retrive_next_token`` (first child)
      and ``retrive_next_sibling`` (next child of the same parent), children in
      ascending node order; entries without a link are left as they are (the
      caller fills them with -1);
    * ``positions[b * n + i] = seq_len[b] + depth of i`` (the walk is cut at
      ``depth`` steps);
    * ``tree_mask``: per node row, the root and the node's ancestors on the
      path (``1``), the other tree columns ``0``; the ``FULL_MASK`` row is
      ``seq_len + n`` wide with the prefix columns left as they are, the
      ``QLEN_ONLY`` row ``n`` wide.
    """
    mode = int(tree_mask_mode)
    if mode == _QLEN_ONLY_BITPACKING:
        raise NotImplementedError("QLEN_ONLY_BITPACKING is not implemented by the CPU shim (nor by the Triton kernel)")
    if mode not in (_FULL_MASK, _QLEN_ONLY):
        raise ValueError(f"unknown tree_mask_mode {tree_mask_mode}")
    n = draft_token_num
    bs = verified_seq_len.shape[0]
    seq = [int(x) for x in verified_seq_len.tolist()]
    parents = parent_list.reshape(bs, -1).tolist() if parent_list.numel() else [[] for _ in range(bs)]
    selected = selected_index.reshape(bs, -1).tolist()
    mask = tree_mask.view(-1)
    nxt = retrive_next_token.view(bs, n)
    sib = retrive_next_sibling.view(bs, n)
    pos = positions.view(-1)
    prefix = 0
    for b in range(bs):
        sel = selected[b][: n - 1]

        def parent_slot(slot: int):
            """The selected-list slot of the parent of ``sel[slot]``: -1 for
            the root, None when the parent was not selected."""
            tb = sel[slot] // topk
            if tb == 0:
                return -1
            token = parents[b][tb]
            for cp, s in enumerate(sel):
                if s == token:
                    return cp
            return None

        for i in range(n - 1, 0, -1):
            retrive_index[b, i] = b * n + i
            p = parent_slot(i - 1)
            if p is None:
                continue
            parent_node = p + 1
            first = int(nxt[b, parent_node])
            nxt[b, parent_node] = i
            if first != -1:
                sib[b, i] = first
        retrive_index[b, 0] = b * n

        s = seq[b]
        pos[b * n] = s
        for x in range(n):
            if mode == _FULL_MASK:
                row = n * n * b + prefix * n + (s + n) * x + s
            else:
                row = n * n * b + n * x
            mask[row] = True
            mask[row + 1: row + n] = False
            if x == 0:
                continue
            cur, d = x - 1, 0
            for _ in range(depth):
                d += 1
                mask[row + 1 + cur] = True
                p = parent_slot(cur)
                if p is None or p == -1:
                    break
                cur = p
            pos[b * n + x] = s + d
        prefix += s
