"""Penalties at each node of a verify tree equal plain decoding's at that position.

The reference is written from SGLang's penalizers (``penaltylib``): for the
logits after position p, frequency subtracts ``penalty * count``, presence
``penalty`` for every token seen, repetition scales every token seen, all
over the output tokens up to p; min_new_tokens adds -inf to the stop tokens
while fewer than ``min_new_tokens`` output tokens precede. The end-to-end
equality with plain decoding is in ``test_feature_matrix.py``; this pins the
tensor logic on random trees, including committed tokens the penalizers have
not counted yet (overlap scheduling).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookahead.plugin.penalties import PenaltySnapshot
from lookahead.plugin.verify import ancestor_mask

VOCAB = 13


def _reference_logits(raw, outputs, freq, pres, rep, min_new, stops):
    """Plain decoding's penalised logits after the output tokens ``outputs``."""
    logits = raw.clone()
    counts = torch.zeros(VOCAB)
    for t in outputs:
        counts[t] += 1
    seen = counts > 0
    additive = -freq * counts - pres * seen.float()
    if len(outputs) < min_new:
        additive[stops] = float("-inf")
    logits += additive
    scale = torch.where(seen, torch.tensor(rep), torch.tensor(1.0))
    return torch.where(logits < 0, logits * scale, logits / scale)


@pytest.mark.parametrize("seed", range(6))
def test_every_node_sees_its_own_path(seed):
    rng = np.random.default_rng(seed)
    bs, width = 3, 5
    freq = torch.tensor([[0.5], [0.0], [0.3]])
    pres = torch.tensor([[0.2], [0.7], [0.0]])
    rep = torch.tensor([[1.3], [1.0], [1.5]])
    min_new = torch.tensor([[0], [6], [4]], dtype=torch.int32)
    stops = [[], [1, 2], [3]]
    stop_pen = torch.zeros(bs, VOCAB)
    for b, s in enumerate(stops):
        stop_pen[b, s] = float("-inf")

    counted_tokens = [rng.integers(0, VOCAB, size=n).tolist() for n in (4, 2, 3)]
    uncounted = [rng.integers(0, VOCAB, size=n).tolist() for n in (0, 2, 1)]
    # The committed state the penalizers hold: the counted tokens only.
    cum_f = torch.zeros(bs, VOCAB)
    cum_p = torch.zeros(bs, VOCAB)
    cum_r = torch.ones(bs, VOCAB)
    for b, toks in enumerate(counted_tokens):
        for t in toks:
            cum_f[b, t] += freq[b, 0]
            cum_p[b, t] = pres[b, 0]
            cum_r[b, t] = rep[b, 0]
    counted = torch.tensor([[len(t)] for t in counted_tokens], dtype=torch.int32)
    snap = PenaltySnapshot(VOCAB, [len(t) for t in counted_tokens], frequency=(cum_f, freq),
                           presence=(cum_p, pres), repetition=(cum_r, rep), min_new=(counted, min_new, stop_pen))

    parent = np.zeros((bs, width), dtype=np.int64)
    for i in range(1, width):
        parent[:, i] = rng.integers(0, i, size=bs)
    mask = ancestor_mask(parent)
    tokens = rng.integers(0, VOCAB, size=(bs, width))
    raw = torch.from_numpy(rng.normal(0, 2, size=(bs * width, VOCAB)).astype(np.float32))
    logits = raw.clone()
    snap.node_logits(logits, tokens.reshape(-1), mask.reshape(-1), uncounted)

    for b in range(bs):
        for i in range(width):
            path = [int(tokens[b, j]) for j in range(1, width) if mask[b, i, j]]
            outputs = counted_tokens[b] + uncounted[b] + path
            expected = _reference_logits(raw[b * width + i], outputs, float(freq[b]), float(pres[b]),
                                         float(rep[b]), int(min_new[b]), stops[b])
            got = logits[b * width + i]
            assert torch.equal(torch.isinf(expected), torch.isinf(got)), (b, i)
            finite = torch.isfinite(expected)
            assert torch.allclose(expected[finite], got[finite], atol=1e-5), (b, i)


def test_min_new_tokens_block_lifts_at_the_right_depth():
    """A chain of drafts: the stop token is blocked at nodes below
    min_new_tokens and free from the node whose position reaches it."""
    width = 5
    parent = np.array([[0, 0, 1, 2, 3]])
    mask = ancestor_mask(parent)
    stop = torch.zeros(1, VOCAB)
    stop[0, 7] = float("-inf")
    # 3 output tokens committed and counted; min_new_tokens = 5.
    snap = PenaltySnapshot(VOCAB, [3], min_new=(torch.tensor([[3]], dtype=torch.int32),
                                                torch.tensor([[5]], dtype=torch.int32), stop))
    logits = torch.zeros(width, VOCAB)
    snap.node_logits(logits, np.array([5, 1, 2, 3, 4]), mask.reshape(-1), [[]])
    # Node d chooses output token number 3 + d: blocked while 3 + d < 5.
    assert [bool(torch.isinf(logits[d, 7])) for d in range(width)] == [True, True, False, False, False]
