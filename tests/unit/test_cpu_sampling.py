"""The CPU tree sampler keeps the target's token distribution.

SGLang verifies greedily on CPU, so ``lookahead.plugin.cpu_sampling`` supplies tree
speculative sampling there.  These tests draw many verify steps on a fixed
small tree and compare the emitted tokens' frequencies with the target
distribution (chi-square), at the root and after an accepted draft token.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lookahead.plugin.cpu_sampling import filtered_probs, sample_tree
from lookahead.plugin.verify import pack_drafts

V = 6
ROOT = np.array([0.30, 0.25, 0.20, 0.10, 0.10, 0.05])  # after the root
AFTER_1 = np.array([0.05, 0.05, 0.10, 0.50, 0.20, 0.10])  # after draft token 1
AFTER_0 = np.array([0.40, 0.10, 0.10, 0.10, 0.10, 0.20])  # after draft token 0
AFTER_13 = np.full(V, 1 / V)  # after tokens 1, 3


class _Draft:
    def __init__(self, tokens, parents):
        self.tokens, self.parents = tokens, parents


def _tree_inputs(trials: int):
    # Draft tree: root -> 1 -> 3, and root -> 0.
    draft = _Draft([1, 0, 3], [-1, -1, 0])
    trees = pack_drafts([draft] * trials, [5] * trials, 4)
    bs, width = trials, trees.width
    mask = torch.from_numpy(trees.mask).view(bs, width, width)
    parent = [-1] + [int(np.flatnonzero(mask[0, i, :i].numpy())[-1]) for i in range(1, width)]
    next_token = torch.full((bs, width), -1, dtype=torch.int64)
    next_sibling = torch.full((bs, width), -1, dtype=torch.int64)
    for i in reversed(range(1, width)):  # children in index order, as sglang's reconstruction does
        p = parent[i]
        next_sibling[:, i] = next_token[:, p]
        next_token[:, p] = i
    retrieve_index = torch.arange(bs * width).view(bs, width)
    node_probs = {0: ROOT, 1: AFTER_1, 2: AFTER_0, 3: AFTER_13}
    probs = torch.tensor(np.stack([node_probs[i] for i in range(width)]), dtype=torch.float32)
    probs = probs.unsqueeze(0).expand(bs, width, V).contiguous()
    candidates = torch.from_numpy(trees.tokens).view(bs, width)
    return probs, candidates, retrieve_index, next_token, next_sibling


def _emitted(trials: int, seed: int = 0):
    probs, cand, ridx, nxt, sib = _tree_inputs(trials)
    gen = torch.Generator().manual_seed(seed)
    predict, accept_index, num_correct = sample_tree(probs, cand, ridx, nxt, sib, gen)
    tokens = predict[accept_index.clamp(min=0).long()].numpy()
    tokens[accept_index.numpy() < 0] = -1
    return tokens, num_correct.numpy()


def test_first_token_follows_target_distribution():
    tokens, _ = _emitted(20000)
    counts = np.bincount(tokens[:, 0], minlength=V)
    stat = chisquare(counts, ROOT * counts.sum())
    assert stat.pvalue > 1e-3, (counts / counts.sum(), ROOT)


def test_token_after_accepted_draft_follows_target_distribution():
    tokens, num_correct = _emitted(20000, seed=1)
    after_1 = tokens[(tokens[:, 0] == 1), 1]
    counts = np.bincount(after_1, minlength=V)
    stat = chisquare(counts, AFTER_1 * counts.sum())
    assert stat.pvalue > 1e-3, (counts / counts.sum(), AFTER_1)
    # A draft token is accepted exactly when the target would emit it.
    assert abs((tokens[:, 0] == 1).mean() - ROOT[1]) < 0.02
    assert num_correct.max() <= 2 and num_correct.min() >= 0


def test_a_broken_sampler_would_fail_this_check():
    # Guard that the chi-square check has teeth: greedy verification (what SGLang
    # does on CPU) emits the root's argmax every time, which this test rejects.
    greedy = np.zeros(V)
    greedy[np.argmax(ROOT)] = 20000
    assert chisquare(greedy + 1e-9, ROOT * 20000).pvalue < 1e-6


def test_one_hot_target_is_deterministic():
    probs, cand, ridx, nxt, sib = _tree_inputs(50)
    one_hot = torch.zeros_like(probs)
    one_hot[:, 0, 1] = 1.0  # root -> 1 (drafted)
    one_hot[:, 1, 3] = 1.0  # 1 -> 3 (drafted)
    one_hot[:, 3, 4] = 1.0  # then 4 (bonus)
    one_hot[:, 2, 0] = 1.0
    predict, accept_index, num_correct = sample_tree(one_hot, cand, ridx, nxt, sib)
    assert (num_correct == 2).all()
    tokens = predict[accept_index.long()].view(50, -1)
    assert (tokens[:, :3] == torch.tensor([1, 3, 4])).all()


@pytest.mark.parametrize("top_k,top_p,min_p", [(1, 1.0, 0.0), (3, 1.0, 0.0), (50, 0.7, 0.0), (50, 1.0, 0.2)])
def test_filters_match_sglang_sampler(top_k, top_p, min_p):
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    torch.manual_seed(0)
    logits = torch.randn(5, 40)
    temps = torch.full((5,), 0.7)
    ours = filtered_probs(logits, temps, torch.full((5,), top_k), torch.full((5,), top_p),
                          torch.full((5,), min_p) if min_p else None)
    probs = torch.softmax(logits / 0.7, dim=-1)
    _, sorted_w, idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), torch.full((5,), top_k), torch.full((5,), top_p), torch.full((5,), min_p),
        bool(min_p), None, torch.zeros(5, dtype=torch.int64), return_filtered_probs=True)
    theirs = torch.zeros_like(probs).scatter_(-1, idx.long(), sorted_w)
    theirs = theirs / theirs.sum(-1, keepdim=True)
    assert torch.allclose(ours, theirs, atol=1e-6)
