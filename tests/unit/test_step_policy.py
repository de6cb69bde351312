"""``StepPolicy`` on recorded step costs: it finds the better option per batch
size, its exploration costs little, and ranks that share rank 0's cost table
decide alike."""

from __future__ import annotations

import random

import pytest

from lookahead.plugin.step_policy import StepPolicy

# Step costs (seconds) as measured on two kinds of machine, per batch size:
# (cost of a single-token step, cost of a width-8 verify step).
MEMORY_BOUND = {bs: (0.010 + 0.0002 * bs, 0.011 + 0.0003 * bs) for bs in range(1, 33)}  # verify ~free
COMPUTE_BOUND = {bs: (0.010 + 0.0004 * bs, 0.010 + 0.0004 * bs * (1 + 7 * min(1.0, bs / 8))) for bs in range(1, 33)}


def simulate(policy, costs, accept_per_request, steps=4000, seed=0, fixed=None):
    """Tokens per second over a run of steps with random batch sizes. ``fixed``:
    True/False to always/never speculate instead of asking the policy."""
    rng = random.Random(seed)
    tokens = seconds = 0.0
    for _ in range(steps):
        bs = rng.choice([1, 2, 4, 8, 16, 32])
        expected = bs * accept_per_request  # the trie's scores, summed
        if fixed is None:
            speculate = policy.decide(bs, expected if policy.wants_drafts(bs) else None).speculate
        else:
            speculate = fixed
        single, verify = costs[bs]
        cost = (verify if speculate else single) * rng.uniform(0.95, 1.05)
        got = bs + (expected * rng.uniform(0.8, 1.2) if speculate else 0)
        tokens += got
        seconds += cost
        if fixed is None:
            policy.record_cost(bs, speculate, cost)
            if speculate:
                policy.record_acceptance(got - bs, expected)
    return tokens / seconds


@pytest.mark.parametrize("costs,accept", [(MEMORY_BOUND, 1.5), (COMPUTE_BOUND, 1.5), (COMPUTE_BOUND, 0.2)])
def test_within_a_few_percent_of_the_best_fixed_choice(costs, accept):
    policy = StepPolicy(max_batch_size=32)
    adaptive = simulate(policy, costs, accept)
    best_fixed = max(simulate(None, costs, accept, fixed=True), simulate(None, costs, accept, fixed=False))
    assert adaptive >= 0.97 * best_fixed, (adaptive, best_fixed)


def test_speculates_where_it_pays_and_not_where_it_costs():
    policy = StepPolicy(max_batch_size=32)
    simulate(policy, COMPUTE_BOUND, 1.0)
    small, large = policy.decide(1, 1.0), policy.decide(32, 32.0)
    assert small.speculate and not large.speculate
    assert small.reason == "pays" and large.reason == "does_not_pay"
    # It stops drafting where speculation does not pay (no try due right now).
    assert not policy.wants_drafts(32) or policy.decide(32, 32.0).reason == "explore"


def test_one_stalled_step_does_not_flip_the_choice():
    """At batch size 1 speculation pays by far; one verify step that stalls for
    30x its cost (the VM, another process) must not stop it speculating."""
    policy = StepPolicy(max_batch_size=32)
    for _ in range(50):
        for speculate in (True, False):
            policy.record_cost(1, speculate, 0.011 if speculate else 0.010)
    assert policy.decide(1, 1.5).reason == "pays"
    policy.record_cost(1, True, 0.33)
    assert policy.decide(1, 1.5).reason == "pays"
    # A lasting change of cost is still followed within a few steps.
    for _ in range(12):
        policy.record_cost(1, True, 0.05)
    assert policy.decide(1, 1.5).reason in ("does_not_pay", "explore")


def test_exploration_is_bounded():
    policy = StepPolicy(max_batch_size=32, explore_every=64)
    simulate(policy, MEMORY_BOUND, 1.5, steps=6000)
    explored = sum(n for (kind, reason), n in policy.decisions.items() if reason == "explore")
    total = sum(policy.decisions.values())
    assert 0 < explored <= total / 30


def test_never_above_the_captured_tier():
    policy = StepPolicy(max_batch_size=8)
    assert not policy.wants_drafts(9)
    assert policy.decide(9, 50.0).reason == "too_large"
    assert policy.decide(3, 0.0).reason == "no_draft"
    assert policy.decide(3, None).reason == "does_not_pay"


def test_ranks_with_rank0s_table_decide_alike():
    """Measured times differ per rank; deciding from rank 0's table, adopted by
    every rank at the same steps, with the same (rank-identical) acceptance,
    every rank takes every decision alike."""
    ranks = [StepPolicy(max_batch_size=32, local_costs=False) for _ in range(2)]
    noise = [(0.9, 1.1), (0.5, 2.0)]  # rank 1 measures much noisier times
    rng = random.Random(1)
    speculated = 0
    for step in range(3000):
        bs = rng.choice([1, 4, 8, 16, 32])
        expected = bs * 0.7
        decisions = [p.decide(bs, expected) for p in ranks]
        assert decisions[0] == decisions[1], step
        speculated += decisions[0].speculate
        single, verify = COMPUTE_BOUND[bs]
        cost = verify if decisions[0].speculate else single
        for p, (lo, hi) in zip(ranks, noise):
            p.record_cost(bs, decisions[0].speculate, cost * rng.uniform(lo, hi))
        if step % 16 == 15:  # the periodic broadcast of rank 0's measurements
            table = ranks[0].measured_table()
            for p in ranks:
                p.adopt(table)
    assert 0 < speculated < 3000  # both options were taken: the comparison meant something
