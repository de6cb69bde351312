"""The floor a drafted node must clear, from measured step costs (``lookahead.plugin.verify_cost``)."""

from __future__ import annotations

import pytest

from lookahead.plugin.verify_cost import MAX_MIN_SCORE, VerifyCost, batch_draft_width


def _feed(cost: VerifyCost, steps: int, base: float, per_token: float, committed: int, widths=(2, 5, 8)):
    for i in range(steps):
        verified = widths[i % len(widths)]
        cost.record(verified, committed, base + per_token * verified)


def test_the_slope_of_step_time_is_the_cost_of_a_verified_token():
    cost = VerifyCost()
    _feed(cost, 200, base=0.050, per_token=0.004, committed=2)
    assert cost.seconds_per_token == pytest.approx(0.004, rel=1e-6)
    # A node must bring what its 4 ms would bring at the current pace:
    # 2 tokens per step of 0.05 + 0.004 * 5 s on average.
    rate = cost.mean_committed / cost.mean_seconds
    assert cost.min_score() == pytest.approx(0.004 * rate, rel=1e-6)
    assert 0.1 < cost.min_score() < 0.12


def test_nothing_is_pruned_before_enough_steps_or_without_varied_widths():
    cost = VerifyCost(min_samples=32)
    _feed(cost, 31, base=0.05, per_token=0.004, committed=2)
    assert cost.min_score() == 0.0
    fixed = VerifyCost()
    _feed(fixed, 100, base=0.05, per_token=0.004, committed=2, widths=(8,))
    assert fixed.seconds_per_token == 0.0 and fixed.min_score() == 0.0


def test_free_verification_prunes_nothing_and_the_floor_is_capped():
    free = VerifyCost()
    _feed(free, 100, base=0.01, per_token=0.0, committed=3)
    assert free.min_score() == pytest.approx(0.0, abs=1e-9)
    dear = VerifyCost()
    _feed(dear, 100, base=0.001, per_token=0.1, committed=6)
    assert dear.min_score() == MAX_MIN_SCORE


def test_the_floor_follows_a_change_of_cost():
    cost = VerifyCost()
    _feed(cost, 200, base=0.05, per_token=0.004, committed=2)
    before = cost.min_score()
    _feed(cost, 400, base=0.05, per_token=0.0005, committed=2)
    assert cost.min_score() < before / 4


def test_what_a_request_costs_of_its_own_is_not_charged_to_its_tokens():
    """Steps at batch sizes 1 to 4, at varied widths: each request costs
    20 ms of its own and each verified token 1.3 ms.  The slope read is the
    token's, not the 3.5 ms that step time regressed on the tokens alone
    gives, where batch size and tokens rise and fall together."""
    cost = VerifyCost()
    widths = (8, 8, 6, 8, 3, 8, 7)
    for i in range(400):
        bs = 1 + (i // 7) % 4
        verified = bs * widths[i % len(widths)]
        cost.record(verified, 3 * bs, 0.07 + 0.02 * bs + 0.0013 * verified, bs)
    assert cost.seconds_per_token == pytest.approx(0.0013, rel=1e-6)


def test_steps_that_verified_or_took_nothing_are_ignored():
    cost = VerifyCost()
    cost.record(0, 0, 0.1)
    cost.record(4, 1, 0.0)
    assert cost.samples == 0


def test_a_cache_leaves_out_nodes_below_its_floor():
    from lookahead import LookaheadCache

    cache = LookaheadCache(background=False)
    try:
        # Thin evidence: after "1 2", each of several continuations was seen once.
        prompt = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 7, 8, 1, 2, 9, 10, 1, 2, 11, 12]
        cache.put_prompt("r", prompt)
        full = cache.draft("r", prompt + [1, 2], 7)
        assert len(full) == 7 and cache.min_score == 0.0
        cache.min_score = 0.15  # the first tokens score 0.18, the second ones less
        pruned = cache.draft("r", prompt + [1, 2], 7)
        assert 0 < len(pruned) < len(full)
        assert pruned.expected <= full.expected
        # Node scores come best first; the pruned draft is the full one's
        # prefix of nodes at or above the floor, and sums to its expectation.
        assert list(full.scores) == sorted(full.scores, reverse=True)
        assert full.expected == pytest.approx(sum(full.scores))
        assert pruned.tokens == full.tokens[:len(pruned)] and pruned.parents == full.parents[:len(pruned)]
        assert len(pruned) == sum(1 for s in full.scores if s >= 0.15)
        with pytest.raises(ValueError, match="min_score"):
            cache.min_score = -0.1
    finally:
        cache.close()


def test_a_batch_verifies_the_width_its_nodes_pay_for_together():
    # One request with a sure chain, three with nothing: the chain's k-th node
    # brings 0.9 tokens for 4 more verified ones, worth it at a floor of 0.2 a
    # request (0.9 >= 4 x 0.2) but not of 0.25, where the longest draft's
    # width would make all four pay for it.
    batch = [[0.95, 0.9, 0.9, 0.85], [], [], []]
    assert batch_draft_width(batch, 0.2) == 4
    assert batch_draft_width(batch, 0.25) == 0
    # Sixteen requests with middling drafts: a column's sum falls with depth.
    batch = [[0.6, 0.3, 0.1, 0.05]] * 8 + [[0.2, 0.1]] * 8
    assert batch_draft_width(batch, 0.3) == 1  # (8 * 0.6 + 8 * 0.2) / 16 = 0.4, then 0.2
    assert batch_draft_width(batch, 0.15) == 2
    assert batch_draft_width(batch, 0.0) == 4
    # At batch 1 it is the floor itself.
    assert batch_draft_width([[0.5, 0.3, 0.2]], 0.25) == 2
    assert batch_draft_width([], 0.1) == 0
