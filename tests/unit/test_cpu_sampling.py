"""The CPU tree sampler keeps the target's token distribution.

SGLang verifies greedily on CPU, so ``lookahead.plugin.cpu_sampling`` supplies tree
speculative sampling there: it draws at each node with SGLang's own sampler
functions and accepts the child that carries the drawn token. These tests
draw many verify steps on a fixed small tree and compare the emitted tokens'
frequencies with the target distribution (chi-square), at the root and after
an accepted draft token, with per-request temperatures and filters mixed in
one batch; and check that seeded sampling draws what plain decoding's
sampler draws at the same position.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lookahead.plugin.cpu_sampling import sample_rows, sample_tree, tree_parents
from lookahead.plugin.verify import pack_drafts

V = 6
ROOT = np.array([0.30, 0.25, 0.20, 0.10, 0.10, 0.05])  # after the root
AFTER_1 = np.array([0.05, 0.05, 0.10, 0.50, 0.20, 0.10])  # after draft token 1
AFTER_0 = np.array([0.40, 0.10, 0.10, 0.10, 0.10, 0.20])  # after draft token 0
AFTER_13 = np.full(V, 1 / V)  # after tokens 1, 3
NODE_PROBS = {0: ROOT, 1: AFTER_1, 2: AFTER_0, 3: AFTER_13}


class _Draft:
    def __init__(self, tokens, parents):
        self.tokens, self.parents = tokens, parents


def _info(bs, temperature=1.0, top_k=1 << 30, top_p=1.0, min_p=0.0, seed=None):
    """A ``SamplingBatchInfo``'s sampling fields, per request."""
    def per_request(value, dtype):
        return (value if isinstance(value, torch.Tensor) else torch.full((bs,), value)).to(dtype)

    top_ks, top_ps, min_ps = per_request(top_k, torch.int32), per_request(top_p, torch.float32), \
        per_request(min_p, torch.float32)
    return types.SimpleNamespace(
        temperatures=per_request(temperature, torch.float32).view(-1, 1),
        top_ks=top_ks, top_ps=top_ps, min_ps=min_ps,
        need_top_k_sampling=bool((top_ks != 1 << 30).any()), need_top_p_sampling=bool((top_ps != 1.0).any()),
        need_min_p_sampling=bool((min_ps > 0).any()),
        max_top_k=None, sampling_seed=None if seed is None else per_request(seed, torch.int64),
    )


def _tree(trials: int):
    """Draft tree root -> 1 -> 3 and root -> 0, ``trials`` times: candidates,
    parents, retrieve indices, positions, and logits whose softmax at
    temperature 1 is ``NODE_PROBS`` at each node."""
    draft = _Draft([1, 0, 3], [-1, -1, 0])
    trees = pack_drafts([draft] * trials, [5] * trials, 4)
    width = trees.width
    parents = tree_parents(torch.from_numpy(trees.mask), trials, width)
    logits = torch.log(torch.tensor(np.stack([NODE_PROBS[i] for i in range(width)]), dtype=torch.float32))
    logits = logits.repeat(trials, 1)
    candidates = torch.from_numpy(trees.tokens).view(trials, width)
    retrieve_index = torch.arange(trials * width).view(trials, width)
    positions = torch.arange(width).repeat(trials) + 100
    return logits, candidates, parents, retrieve_index, positions


def _emitted(trials: int, seed: int = 0, info=None):
    logits, cand, parents, ridx, pos = _tree(trials)
    torch.manual_seed(seed)
    predict, accept_index, num_correct = sample_tree(logits, info or _info(trials), cand, parents, ridx, pos)
    tokens = predict[accept_index.clamp(min=0).long()].numpy()
    tokens[accept_index.numpy() < 0] = -1
    return tokens, num_correct.numpy()


def test_parents_from_the_ancestor_mask():
    _, _, parents, _, _ = _tree(2)
    assert parents.tolist() == [[-1, 0, 0, 1]] * 2


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
    after_0 = tokens[(tokens[:, 0] == 0), 1]
    stat = chisquare(np.bincount(after_0, minlength=V), AFTER_0 * len(after_0))
    assert stat.pvalue > 1e-3
    # A draft token is accepted exactly when the target would emit it.
    assert abs((tokens[:, 0] == 1).mean() - ROOT[1]) < 0.02
    assert num_correct.max() == 2 and num_correct.min() == 0
    # Depth 2 (1 then 3) happens with probability p(1) * p(3 | 1).
    assert abs((num_correct == 2).mean() - ROOT[1] * AFTER_1[3]) < 0.01


def test_a_broken_sampler_would_fail_this_check():
    # Guard that the chi-square check has teeth: greedy verification (what SGLang
    # does on CPU) emits the root's argmax every time, which this test rejects.
    greedy = np.zeros(V)
    greedy[np.argmax(ROOT)] = 20000
    assert chisquare(greedy + 1e-9, ROOT * 20000).pvalue < 1e-6


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (0.7, 1 << 30, 1.0, 0.0), (1.0, 3, 1.0, 0.0), (1.3, 1 << 30, 0.7, 0.0), (1.0, 1 << 30, 1.0, 0.5)])
def test_filters_and_temperature_keep_plain_decodings_distribution(temperature, top_k, top_p, min_p):
    # The emitted first token follows the distribution plain decoding's
    # sampler draws from with the same settings.
    trials = 12000
    info = _info(trials, temperature, top_k, top_p, min_p)
    tokens, _ = _emitted(trials, seed=2, info=info)
    p = ROOT ** (1 / temperature)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(V, dtype=bool)
    mass = 0.0
    for rank, tok in enumerate(order):
        if rank < top_k and mass <= top_p and p[tok] >= min_p * p[order[0]]:
            keep[tok] = True
        mass += p[tok]
    expected = np.where(keep, p, 0.0)
    expected /= expected.sum()
    counts = np.bincount(tokens[:, 0], minlength=V)
    assert (counts[~keep] == 0).all(), counts
    stat = chisquare(counts[keep], expected[keep] * counts.sum())
    assert stat.pvalue > 1e-3, (counts / counts.sum(), expected)


def test_per_request_settings_mixed_in_one_batch():
    # Greedy (top-k 1), temperature 0.5 and top-p 0.4 requests side by side.
    trials = 3 * 6000
    kind = torch.arange(trials) % 3
    info = _info(trials, torch.where(kind == 1, 0.5, 1.0), torch.where(kind == 0, 1, 1 << 30),
                 torch.where(kind == 2, 0.4, 1.0))
    tokens, _ = _emitted(trials, seed=3, info=info)
    first = tokens[:, 0]
    assert (first[kind.numpy() == 0] == 0).all()  # greedy: the root's argmax
    assert set(first[kind.numpy() == 2]) <= {0, 1}  # top-p 0.4 keeps 0.30 and 0.25
    cold = ROOT ** 2 / (ROOT ** 2).sum()
    counts = np.bincount(first[kind.numpy() == 1], minlength=V)
    assert chisquare(counts, cold * counts.sum()).pvalue > 1e-3


def test_seeded_sampling_draws_what_plain_decoding_draws(sgl_kernel_shim):
    # With sampling_seed, plain decoding's draw at a position depends on the
    # seed, the position and the distribution only: the tree sampler emits
    # the same token at every position it commits.
    trials = 200
    logits, cand, parents, ridx, pos = _tree(trials)
    seeds = torch.arange(trials) * 7919 + 1
    info = _info(trials, seed=seeds)
    predict, accept_index, num_correct = sample_tree(logits, info, cand, parents, ridx, pos)
    width = cand.shape[1]
    for depth in range(3):
        rows = [(b, int(accept_index[b, depth])) for b in range(trials) if depth <= num_correct[b]]
        b_idx = torch.tensor([b for b, _ in rows])
        flat = torch.tensor([r for _, r in rows])
        plain = sample_rows(logits, info, flat, b_idx, pos[flat])
        assert torch.equal(predict[flat], plain)
    # Different seeds give different draws: the check above is not vacuous.
    assert len(set(predict[accept_index[:, 0].long()].tolist())) > 2
    assert (num_correct > 0).any()
    del width


def test_one_hot_target_is_deterministic():
    logits, cand, parents, ridx, pos = _tree(50)
    one_hot = torch.full_like(logits, -1e9).view(50, 4, V)
    one_hot[:, 0, 1] = 0.0  # root -> 1 (drafted)
    one_hot[:, 1, 3] = 0.0  # 1 -> 3 (drafted)
    one_hot[:, 3, 4] = 0.0  # then 4 (bonus)
    one_hot[:, 2, 0] = 0.0
    predict, accept_index, num_correct = sample_tree(one_hot.view(200, V), _info(50), cand, parents, ridx, pos)
    assert (num_correct == 2).all()
    tokens = predict[accept_index.long()].view(50, -1)
    assert (tokens[:, :3] == torch.tensor([1, 3, 4])).all()


def test_only_accepted_nodes_are_sampled(monkeypatch):
    # The cost claim: one sampled row per committed token.
    import lookahead.plugin.cpu_sampling as cs

    sampled = []
    real = cs.sample_rows

    def counting(logits, info, rows, requests, positions):
        sampled.append(len(rows))
        return real(logits, info, rows, requests, positions)

    monkeypatch.setattr(cs, "sample_rows", counting)
    trials = 500
    logits, cand, parents, ridx, pos = _tree(trials)
    _, _, num_correct = cs.sample_tree(logits, _info(trials), cand, parents, ridx, pos)
    assert sum(sampled) == int(num_correct.sum()) + trials
