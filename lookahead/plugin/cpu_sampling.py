"""Tree speculative sampling for CPU verification.

SGLang 0.5.23 verifies draft trees greedily on CPU whatever the request's
sampling settings (``eagle_utils._verify_uses_greedy`` is true for CPU: its
sampling-verify kernels exist only for CUDA).  A sampled request would then
silently decode greedily.  This module is the missing CPU path: the same
"target-only" tree rejection sampling as sgl_kernel's
``tree_speculative_sampling_target_only``, in plain torch.

Drafts are deterministic proposals (a one-hot draft distribution), so at
each node the children are tried in sibling order: child ``c`` is accepted
with probability ``p(c)`` under the current residual ``p``; on rejection
``p(c)`` is zeroed and ``p`` renormalised; if every child is rejected the
bonus token is drawn from the residual.  That is sequential rejection
sampling, so every emitted token is distributed exactly as the target's
filtered distribution (temperature, top-k, top-p, min-p: the filters of
SGLang's own sampler, ``top_k_top_p_min_p_sampling_from_probs_torch``).
"""

from __future__ import annotations

import torch


def filtered_probs(logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor,
                   top_ps: torch.Tensor, min_ps: torch.Tensor | None) -> torch.Tensor:
    """Rows of ``logits`` -> the distributions SGLang's sampler draws from."""
    probs = torch.softmax(logits.float() / temperatures.view(-1, 1), dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    rank = torch.arange(probs.shape[-1], device=probs.device).view(1, -1)
    sorted_probs[rank >= top_ks.view(-1, 1)] = 0.0
    sorted_probs[(cumulative - sorted_probs) > top_ps.view(-1, 1)] = 0.0
    if min_ps is not None:
        sorted_probs[sorted_probs < (sorted_probs[:, :1] * min_ps.view(-1, 1))] = 0.0
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return out / out.sum(dim=-1, keepdim=True)


def sample_tree(probs: torch.Tensor, candidates: torch.Tensor, retrieve_index: torch.Tensor,
                next_token: torch.Tensor, next_sibling: torch.Tensor,
                generator: torch.Generator | None = None):
    """Rejection-sample a path through each request's draft tree.

    ``probs`` [bs, W, V] is the target's distribution after each node;
    ``candidates`` [bs, W] the node tokens (node 0 is the root).  Returns
    ``(predict [bs*W] int32, accept_index [bs, W] int32, num_correct [bs] int32)``
    in the layout of SGLang's verify kernels: ``accept_index`` lists the
    accepted nodes' flat indices from the root, and ``predict`` at each of
    them holds the token that follows it.
    """
    bs, width, _ = probs.shape
    predict = torch.zeros(bs * width, dtype=torch.int32)
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    num_correct = torch.zeros(bs, dtype=torch.int32)
    cand, nxt, sib, ridx = (t.cpu().tolist() for t in (candidates, next_token, next_sibling, retrieve_index))
    for b in range(bs):
        node, depth = 0, 0
        accept_index[b, 0] = ridx[b][0]
        while True:
            residual = probs[b, node].clone()
            child = nxt[b][node]
            accepted = -1
            while child != -1:
                token = cand[b][child]
                if torch.rand((), generator=generator).item() < residual[token].item():
                    accepted = child
                    break
                residual[token] = 0.0
                total = residual.sum()
                if total <= 0:
                    break
                residual /= total
                child = sib[b][child]
            if accepted < 0:
                predict[ridx[b][node]] = int(torch.multinomial(residual, 1, generator=generator))
                break
            predict[ridx[b][node]] = cand[b][accepted]
            depth += 1
            accept_index[b, depth] = ridx[b][accepted]
            node = accepted
        num_correct[b] = depth
    return predict, accept_index, num_correct


def tree_sampling_verify(verify_input, batch, logits_output, grammar_mask=None,
                         generator: torch.Generator | None = None):
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

    def per_node(t):
        return torch.repeat_interleave(t.view(-1), width, dim=0)

    probs = filtered_probs(
        logits,
        per_node(info.temperatures),
        per_node(info.top_ks),
        per_node(info.top_ps),
        per_node(info.min_ps) if getattr(info, "need_min_p_sampling", False) else None,
    ).view(bs, width, -1)
    candidates = verify_input.draft_token.view(bs, width)
    predict, accept_index, num_correct = sample_tree(
        probs, candidates, verify_input.retrieve_index, verify_input.retrieve_next_token,
        verify_input.retrieve_next_sibling, generator,
    )
    device = logits.device
    return predict.to(device), (num_correct + 1).to(device), accept_index.to(device)
