"""The feature matrix's logprob tolerance, checked against the tiny model itself.

The matrix compares LOOKAHEAD's logprobs with plain decoding's within
``LOGPROB_TOLERANCE``: a verify computes them in an extend-shaped forward, a
plain step in a decode-shaped one, and float32 sums in a different order. The
tolerance is only sound if it sits far above that noise and far below what
any real fault moves: a token of context wrong, dropped, or at the wrong
position. Both are measured here, on the model the matrix runs.
"""

from __future__ import annotations

import pytest

from lookahead.validate.feature_matrix import LOGPROB_TOLERANCE

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TRIALS = 12


@pytest.fixture(scope="module")
def model(tiny_model):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def _last_logprobs(model, ids, positions=None):
    with torch.no_grad():
        out = model(torch.tensor([ids]), position_ids=None if positions is None else torch.tensor([positions]))
    return torch.log_softmax(out.logits[0, -1], -1)


def _decoded_logprobs(model, ids):
    """The last token's logprobs from one decode step after a prefill of the rest."""
    with torch.no_grad():
        past = model(torch.tensor([ids[:-1]]), use_cache=True).past_key_values
        out = model(torch.tensor([ids[-1:]]), past_key_values=past, use_cache=True)
    return torch.log_softmax(out.logits[0, -1], -1)


def _contexts(model):
    gen = torch.Generator().manual_seed(1)
    for trial in range(TRIALS):
        n = 16 + 3 * trial
        yield trial, torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist()


def _top_shift(reference, other, k=3):
    top = reference.topk(k).indices
    return (other[top] - reference[top]).abs().max().item()


def test_extend_against_decode_noise_is_well_inside_the_tolerance(model):
    noise = max(_top_shift(_last_logprobs(model, ids), _decoded_logprobs(model, ids)) for _, ids in _contexts(model))
    assert noise < LOGPROB_TOLERANCE / 3


def test_a_wrong_context_moves_logprobs_far_past_the_tolerance(model):
    shifts = []
    for trial, ids in _contexts(model):
        ref = _last_logprobs(model, ids)
        k = trial % (len(ids) - 1)
        swapped = list(ids)
        swapped[k] = (swapped[k] + 1) % model.config.vocab_size
        misplaced = list(range(len(ids)))
        misplaced[-1] += 1  # the newest token one position too far, as a misplaced draft would be
        shifts += [_top_shift(ref, _last_logprobs(model, swapped)),
                   _top_shift(ref, _last_logprobs(model, ids[:k] + ids[k + 1:])),
                   _top_shift(ref, _last_logprobs(model, ids, misplaced))]
    assert min(shifts) > 100 * LOGPROB_TOLERANCE
