"""Lay out a batch of drafts as the fixed-width verify trees SGLang expects.

SGLang's TARGET_VERIFY forward takes every request at the same width ``W``:
node 0 is the request's last accepted token (the root), nodes 1..W-1 are
draft tokens in topological order, and an ancestor mask
``mask[b, i, j] = 1`` iff node ``j`` is node ``i`` or one of its ancestors
(the layout NGRAM's corpus produces, which ``reconstruct_indices_from_tree_mask``
turns into positions and retrieve indices).

Two choices keep padding cheap:

* the width is chosen per step as ``1 + the longest draft in the batch``
  (capped at ``--speculative-num-draft-tokens``), so a step whose drafts are
  short does not pay for the full width;
* short drafts are padded with token 0 hanging off the root (or, when every
  draft is a chain, off the end of the chain, so the whole batch stays a
  chain and the attention backend can use plain causal masking).  A padding
  node is verified like any other: if the target happens to predict its
  token, accepting it is still exactly what plain decoding would emit.

The packing is pure numpy on purpose: it runs on the host between forward
passes and is unit-tested without a model. ``full_verify_mask`` is the one
device-side piece: the mask layout GPU backends take, built on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

PAD_TOKEN = 0


@dataclass
class VerifyTrees:
    tokens: np.ndarray  # int64 [bs * width]: root then drafts, per request
    mask: np.ndarray  # bool [bs * width * width]: ancestor-or-self mask, per request
    width: int
    is_chain: bool  # every request's tree is a single chain
    draft_lens: list  # real (unpadded) draft tokens per request


def verify_width(drafts: Sequence, max_width: int) -> int:
    """1 + the longest draft, capped at ``max_width`` (the configured width)."""
    longest = max((len(d.tokens) for d in drafts), default=0)
    return max(1, min(max_width, 1 + longest))


def _is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def pack_drafts(drafts: Sequence, roots: Sequence[int], width: int) -> VerifyTrees:
    """Pack ``drafts`` (objects with ``tokens`` and ``parents``, parents[i] == -1
    meaning the root) below their ``roots`` into width-``width`` trees.
    Drafts longer than ``width - 1`` are cut to their first ``width - 1``
    nodes, which is still a tree since parents precede children."""
    bs = len(drafts)
    if len(roots) != bs:
        raise ValueError(f"{bs} drafts but {len(roots)} roots")
    if width < 1:
        raise ValueError(f"verify width must be >= 1, got {width}")
    if width == 1:
        # The fallback tier's tree: the root alone. Every step above the max
        # batch size takes this, so it skips the general layout.
        return VerifyTrees(np.asarray(roots, dtype=np.int64), np.ones(bs, dtype=bool), 1, True, [0] * bs)
    tokens = np.full((bs, width), PAD_TOKEN, dtype=np.int64)
    parent = np.zeros((bs, width), dtype=np.int64)
    chain = all(_is_chain(d.parents[: width - 1]) for d in drafts)
    draft_lens = []
    for b, (draft, root) in enumerate(zip(drafts, roots)):
        n = min(len(draft.tokens), width - 1)
        draft_lens.append(n)
        tokens[b, 0] = root
        if n:
            tokens[b, 1 : n + 1] = draft.tokens[:n]
            parent[b, 1 : n + 1] = np.asarray(draft.parents[:n], dtype=np.int64) + 1
        if chain:
            # Padding continues the chain: node i hangs off node i - 1.
            parent[b, n + 1 :] = np.arange(n, width - 1)
        # else padding hangs off the root (parent 0), as initialised.
    return VerifyTrees(tokens.reshape(-1), ancestor_mask(parent).reshape(-1), width, chain, draft_lens)


def ancestor_mask(parent: np.ndarray) -> np.ndarray:
    """[bs, W] parent indices (node 0 is the root) -> [bs, W, W] bool mask of
    ancestors-or-self.  Parents precede children, so one pass suffices."""
    bs, width = parent.shape
    mask = np.zeros((bs, width, width), dtype=bool)
    rows = np.arange(bs)
    mask[:, 0, 0] = True
    for i in range(1, width):
        mask[:, i, :] = mask[rows, parent[:, i], :]
        mask[:, i, i] = True
    return mask


def full_verify_mask(tree_mask: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int, width: int,
                     buffer: torch.Tensor) -> torch.Tensor:
    """The verify mask of SGLang's GPU backends, built on ``tree_mask``'s device.

    Per request and per tree row: ``seq_len`` ones (the committed prefix),
    then the row of its ``[W, W]`` tree mask; all requests flattened in
    order. ``buffer`` (bool, at least ``width * (seq_lens_sum + bs * width)``
    long) holds the result, so that a step allocates nothing and the host
    does no work that grows with the context.
    """
    bs = seq_lens.numel()
    total = width * (seq_lens_sum + bs * width)
    out = buffer[:total]
    out.fill_(True)
    lens = seq_lens.to(torch.int64)
    row = lens + width  # each row: prefix then tree
    start = torch.cumsum(width * row, dim=0) - width * row
    cols = torch.arange(width, device=out.device)
    index = (start.view(-1, 1, 1) + cols.view(1, -1, 1) * row.view(-1, 1, 1)
             + lens.view(-1, 1, 1) + cols.view(1, 1, -1))
    out[index.reshape(-1)] = tree_mask.reshape(-1)
    return out
