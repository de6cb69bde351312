"""Tree speculative sampling for CPU verification, by SGLang's own sampler.

SGLang 0.5.23 verifies draft trees greedily on CPU whatever the request's
sampling settings (``eagle_utils._verify_uses_greedy`` is true for CPU: its
sampling-verify kernels exist only for CUDA).  A sampled request would then
silently decode greedily.  This module is LOOKAHEAD's CPU path.

It samples the way plain decoding does and keeps the drafts that agree:
from the root down, each request's current node gets one token drawn by
SGLang's own sampler functions (``sglang.srt.layers.sampler``: temperature,
softmax, then top-k, top-p and min-p only where some request sets them, and
``sampling_seed`` with the node's position, as plain decoding seeds its
draw); if a child of the node carries that token, the child is accepted and
the walk goes on from it, otherwise the token is the step's bonus token.

Why this is exact: every emitted token is a plain decoding draw from the
target's filtered distribution at its position, given the tokens before it
(a drafted child is emitted only because the draw produced its token).  A
child is therefore accepted with the target's probability of its token,
which is what sequential rejection sampling of deterministic drafts
(``tree_speculative_sampling_target_only``) accepts it with; the two differ
only in how the coins are drawn.  With ``sampling_seed`` in float32 the
output is plain decoding's own, token for token.

Why it is cheap: only the rows of nodes on the accepted path are sampled,
one per committed token, so a step costs what plain decoding's sampler costs
for the tokens it commits, and a width-1 step (no drafts) is exactly plain
decoding's sampler call.  There is no vocabulary sort unless a filter is on
(that is SGLang's own rule), and the walk is one vectorised pass per tree
depth, not a Python loop over nodes.
"""

from __future__ import annotations

import torch

from sglang.kernels.ops.sampling import softmax as sampler_softmax
from sglang.srt.layers.sampler import sampling_from_probs_torch, top_k_top_p_min_p_sampling_from_probs_torch


def sample_rows(logits: torch.Tensor, info, rows: torch.Tensor, requests: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
    """One token for each of ``logits[rows]``, drawn as plain decoding's
    sampler draws it (``Sampler.forward``'s standard path), with the
    sampling parameters of ``requests`` (indices into ``info``'s rows) and
    ``positions`` for seeded sampling.  ``logits`` is left as it is."""
    logits = logits.index_select(0, rows)
    logits.div_(info.temperatures.index_select(0, requests).view(-1, 1))
    probs = sampler_softmax(logits)
    seeds = None if info.sampling_seed is None else info.sampling_seed.index_select(0, requests)
    if not (info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling):
        return sampling_from_probs_torch(probs, sampling_seed=seeds, positions=positions)
    return top_k_top_p_min_p_sampling_from_probs_torch(
        probs,
        info.top_ks.index_select(0, requests),
        info.top_ps.index_select(0, requests),
        info.min_ps.index_select(0, requests),
        info.need_min_p_sampling,
        seeds,
        positions,
        max_top_k=info.max_top_k,
    ).to(torch.int32)


def tree_parents(mask: torch.Tensor, bs: int, width: int) -> torch.Tensor:
    """``[bs, width]`` parent node of each node (-1 for the roots), from the
    ancestor-or-self mask: nodes are in topological order, so a node's parent
    is its highest-numbered strict ancestor."""
    m = mask.view(bs, width, width) & torch.ones(width, width, dtype=torch.bool).tril(-1)
    index = torch.arange(width).view(1, 1, width)
    parents = torch.where(m, index, -1).amax(dim=-1)
    return parents


def sample_tree(logits: torch.Tensor, info, candidates: torch.Tensor, parents: torch.Tensor,
                retrieve_index: torch.Tensor, positions: torch.Tensor):
    """Walk each request's draft tree, sampling at the current node and
    accepting the child that carries the sampled token.

    ``logits`` [bs * W, V] are the target's logits after each node (with
    every logit change plain decoding makes already applied); ``candidates``
    [bs, W] the node tokens (node 0 is the root); ``parents`` [bs, W] as
    ``tree_parents`` gives them; ``positions`` [bs * W] each node's position.
    Returns ``(predict [bs*W] int32, accept_index [bs, W] int32,
    num_correct [bs] int32)`` in the layout of SGLang's verify kernels:
    ``accept_index`` lists the accepted nodes' flat indices from the root,
    and ``predict`` at each of them holds the token that follows it."""
    bs, width = candidates.shape
    predict = torch.zeros(bs * width, dtype=torch.int32)
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    num_correct = torch.zeros(bs, dtype=torch.int32)
    retrieve_index = retrieve_index.to(torch.int64)
    candidates = candidates.to(torch.int64)
    accept_index[:, 0] = retrieve_index[:, 0].to(torch.int32)
    active = torch.arange(bs)
    node = torch.zeros(bs, dtype=torch.int64)
    for depth in range(width):
        rows = active * width + node
        token = sample_rows(logits, info, rows, active, positions.index_select(0, rows)).to(torch.int64)
        predict[retrieve_index[active, node]] = token.to(torch.int32)
        if depth == width - 1:
            break
        # The child of the current node that carries the sampled token (the
        # first one, should padding have repeated a token among siblings).
        match = (parents.index_select(0, active) == node.view(-1, 1)) & \
                (candidates.index_select(0, active) == token.view(-1, 1))
        hit = match.any(dim=1)
        if not bool(hit.any()):
            break
        child = match.to(torch.int8).argmax(dim=1)[hit]
        active = active[hit]
        node = child
        accept_index[active, depth + 1] = retrieve_index[active, node].to(torch.int32)
        num_correct[active] = depth + 1
    return predict, accept_index, num_correct


def tree_sampling_verify(verify_input, batch, logits_output, grammar_mask=None):
    """Drop-in for ``eagle_sample`` on CPU for batches that sample: returns
    ``(predict, accept_lens, accept_index)`` with accept_lens counting the bonus.

    The logits arrive penalised (``lookahead.plugin.penalties``); what is left
    of ``eagle_sample``'s preparation is the logit bias and the grammar mask.
    """
    info = batch.sampling_info
    width = verify_input.draft_token_num
    bs = len(batch.seq_lens)
    logits = logits_output.next_token_logits
    if info.logit_bias is not None:
        logits.add_(torch.repeat_interleave(info.logit_bias, width, dim=0))
    if grammar_mask is not None:
        grammar_mask.apply(logits)
    if width == 1:
        parents = torch.full((bs, 1), -1, dtype=torch.int64)
    else:
        parents = tree_parents(verify_input.custom_mask, bs, width)
    predict, accept_index, num_correct = sample_tree(
        logits, info, verify_input.draft_token.view(bs, width), parents,
        verify_input.retrieve_index, verify_input.positions.view(-1).to(torch.int64),
    )
    device = logits.device
    return predict.to(device), (num_correct + 1).to(device), accept_index.to(device)
