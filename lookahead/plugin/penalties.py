"""Penalties and ``min_new_tokens`` at every node of a verify tree, exactly as
plain decoding would apply them at that position.

Plain decoding penalises the logits after position ``p`` with the counts of
every output token up to ``p``. SGLang's speculative flow falls short twice,
for NGRAM as for any algorithm that verifies several tokens per step:

* its penalizers hear one token per step (``cumulate_penalty_output_tokens``
  feeds ``output_ids[-1]``), so the tokens accepted before the last one of a
  step are never counted, and ``min_new_tokens`` counts steps;
* ``eagle_sample`` gives every node of the tree the committed state only,
  whatever the draft tokens on the node's own path.

LOOKAHEAD closes both gaps, keeping SGLang's penalizers as the one store of
committed state:

1. ``cumulate_new_output_tokens`` stands in for the batch's
   ``cumulate_penalty_output_tokens`` and feeds the penalizers every output
   token they have not seen yet (a per-request count on the ``Req``);
2. ``PenaltySnapshot.take`` copies the committed state when the scheduler makes
   the forward's copy of the sampling info (the copy carries no orchestrator);
3. ``PenaltySnapshot.node_logits`` rebuilds, for each node, the penalties of
   the committed tokens, the committed tokens the penalizers have not heard of
   yet (under overlap scheduling, the previous step's), and the draft tokens
   on the path from the root to the node; the stop-token block of
   ``min_new_tokens`` holds while the node's output position is below it.

The tensors are dense ``[nodes, vocab]``, like SGLang's own, and exist only
for batches that use penalties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from sglang.srt.sampling.penaltylib.frequency_penalty import BatchedFrequencyPenalizer
from sglang.srt.sampling.penaltylib.min_new_tokens import BatchedMinNewTokensPenalizer
from sglang.srt.sampling.penaltylib.presence_penalty import BatchedPresencePenalizer
from sglang.srt.sampling.penaltylib.repetition_penalty import (
    BatchedRepetitionPenalizer,
    apply_scaling_penalties,
)

# How many of a request's output tokens its penalizer rows have counted.
# Reset when the request is (re)prefilled, which gives it fresh rows.
COUNTED_ATTR = "_lookahead_penalized_tokens"

# SGLang 0.5.23 builds every batch's orchestrator with exactly these four
# penalizers (SamplingBatchInfo.from_schedule_batch); both functions below
# handle each of them.


def reset_counts(reqs) -> None:
    """The requests get fresh penalizer rows (a prefill): nothing is counted."""
    for req in reqs:
        setattr(req, COUNTED_ATTR, 0)


def _padded(rows: Sequence[Sequence[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged token lists -> ``[n, k]`` ids padded with ``pad`` and their validity."""
    width = max(1, max((len(r) for r in rows), default=0))
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    ids_t = torch.from_numpy(ids).to(device, non_blocking=True)
    return ids_t, ids_t != pad


def _marks(ids: torch.Tensor, weights: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[n, vocab]`` float sums of ``weights`` at ``ids``; ids equal to ``vocab`` are padding."""
    out = torch.zeros((ids.shape[0], vocab + 1), dtype=torch.float32, device=ids.device)
    out.scatter_add_(1, ids, weights.to(torch.float32))
    return out[:, :vocab]


def cumulate_new_output_tokens(batch) -> None:
    """Feed the batch's penalizers every output token they have not counted.

    The stand-in for ``ScheduleBatch.cumulate_penalty_output_tokens`` in a
    LOOKAHEAD batch (called by SGLang as the decode step is prepared). Under
    overlap scheduling the previous step's tokens are not in ``output_ids``
    yet; they are counted one step later, and the verify step adds them itself
    meanwhile (``PenaltySnapshot.node_logits``).
    """
    orchestrator = batch.sampling_info.penalizer_orchestrator
    new = []
    for req in batch.reqs:
        counted = getattr(req, COUNTED_ATTR, 0)
        out = req.output_ids
        new.append(list(out[counted:]))
        setattr(req, COUNTED_ATTR, len(out))
    if not any(new):
        return
    vocab = orchestrator.vocab_size
    ids, valid = _padded(new, vocab, batch.device)
    counts = _marks(ids, valid, vocab)  # [bs, vocab]: occurrences of each new token
    seen = counts > 0
    for penalizer in orchestrator.penalizers.values():
        if not penalizer.is_prepared():
            continue
        if isinstance(penalizer, BatchedFrequencyPenalizer):
            penalizer.cumulated_frequency_penalties.add_(counts * penalizer.frequency_penalties)
        elif isinstance(penalizer, BatchedPresencePenalizer):
            p = penalizer.cumulated_presence_penalties
            p.copy_(torch.where(seen, penalizer.presence_penalties.expand_as(p), p))
        elif isinstance(penalizer, BatchedRepetitionPenalizer):
            r = penalizer.cumulated_repetition_penalties
            r.copy_(torch.where(seen, penalizer.repetition_penalties.expand_as(r), r))
        elif isinstance(penalizer, BatchedMinNewTokensPenalizer):
            penalizer.len_output_tokens.add_(valid.sum(dim=1, keepdim=True).to(penalizer.len_output_tokens.dtype))


@dataclass
class PenaltySnapshot:
    """The committed penalty state of one forward's batch, row per request."""

    vocab: int
    counted: list  # output tokens each request's rows have counted
    frequency: Optional[tuple] = None  # (cumulated [bs, V], penalty [bs, 1])
    presence: Optional[tuple] = None  # (cumulated [bs, V], penalty [bs, 1])
    repetition: Optional[tuple] = None  # (cumulated [bs, V], penalty [bs, 1])
    min_new: Optional[tuple] = None  # (counted [bs, 1], min_new_tokens [bs, 1], stop penalties [bs, V])

    @classmethod
    def take(cls, orchestrator, reqs) -> "PenaltySnapshot":
        snap = cls(orchestrator.vocab_size, [getattr(r, COUNTED_ATTR, 0) for r in reqs])
        for penalizer in orchestrator.penalizers.values():
            if not penalizer.is_prepared():
                continue
            if isinstance(penalizer, BatchedFrequencyPenalizer):
                snap.frequency = (penalizer.cumulated_frequency_penalties.clone(), penalizer.frequency_penalties)
            elif isinstance(penalizer, BatchedPresencePenalizer):
                snap.presence = (penalizer.cumulated_presence_penalties.clone(), penalizer.presence_penalties)
            elif isinstance(penalizer, BatchedRepetitionPenalizer):
                snap.repetition = (penalizer.cumulated_repetition_penalties.clone(),
                                   penalizer.repetition_penalties)
            elif isinstance(penalizer, BatchedMinNewTokensPenalizer):
                snap.min_new = (penalizer.len_output_tokens.clone(), penalizer.min_new_tokens,
                                penalizer.stop_token_penalties)
        return snap

    def node_logits(self, logits: torch.Tensor, tree_tokens: np.ndarray, tree_mask: np.ndarray,
                    uncounted: Sequence[Sequence[int]]) -> None:
        """Penalise ``logits`` ``[bs * W, V]`` in place, node by node.

        ``tree_tokens`` ``[bs * W]`` and ``tree_mask`` ``[bs * W * W]`` are the
        host layout of the verify trees (node 0 the root, the mask
        ancestor-or-self); ``uncounted[b]`` are request ``b``'s committed
        output tokens beyond ``counted[b]``.
        """
        bs = len(self.counted)
        width = tree_tokens.shape[0] // bs
        device = logits.device
        vocab = self.vocab
        tokens = tree_tokens.reshape(bs, width)
        ancestors = tree_mask.reshape(bs, width, width).copy()
        ancestors[:, :, 0] = False  # the root is committed: counted, or in ``uncounted``
        depth = ancestors.sum(axis=2)  # draft tokens from the root to the node, itself included

        # Per node: its path's draft tokens, then the request's uncounted tokens.
        rows = []
        for b in range(bs):
            extra = list(uncounted[b])
            for i in range(width):
                rows.append(extra + tokens[b][ancestors[b, i]].tolist())
        ids, valid = _padded(rows, vocab, device)
        path_counts = _marks(ids, valid, vocab)  # [bs * W, V]
        on_path = path_counts > 0

        def per_node(t: torch.Tensor) -> torch.Tensor:
            return torch.repeat_interleave(t, width, dim=0)

        additive = torch.zeros_like(logits, dtype=torch.float32)
        if self.frequency is not None:
            cumulated, penalty = self.frequency
            additive -= per_node(cumulated) + per_node(penalty) * path_counts
        if self.presence is not None:
            cumulated, penalty = self.presence
            present = per_node(cumulated != 0) | on_path
            additive -= per_node(penalty) * present
        if self.min_new is not None:
            counted, min_new, stop = self.min_new
            extra = torch.tensor([len(u) for u in uncounted], dtype=counted.dtype, device=device).view(-1, 1)
            node_depth = torch.from_numpy(depth.reshape(-1, 1)).to(device=device, dtype=counted.dtype)
            # The node's logits choose output token number counted + extra + depth (0-based).
            position = per_node(counted + extra) + node_depth
            additive += torch.where(position < per_node(min_new), per_node(stop), 0.0)
        logits.add_(additive.to(logits.dtype))
        if self.repetition is not None:
            cumulated, penalty = self.repetition
            scaling = torch.where(on_path, per_node(penalty).expand_as(on_path), per_node(cumulated))
            apply_scaling_penalties(logits, scaling)
