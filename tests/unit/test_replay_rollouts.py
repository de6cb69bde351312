"""The rollout replay: lock-step groups, steps in order, the engine's step count."""

from __future__ import annotations

import numpy as np

import replay_rollouts
from lookahead.replay import baselines


def lookahead():
    return baselines.LookaheadDrafter(background=False)


def test_an_earlier_steps_rollouts_draft_the_same_prompts_answers():
    rng = np.random.default_rng(0)
    prompts = [np.arange(10, 30, dtype=np.int32)]
    answers = [rng.integers(100, 40000, 48).tolist() for _ in range(2)]  # no answer repeats itself
    (t1, s1), (t2, s2) = replay_rollouts.replay_rollout(lookahead(), prompts, [answers, answers], budget=7)
    assert t1 == t2 == 96
    # Step 1: the two samples of the group are written in lock-step and differ,
    # so neither drafts the other: every token takes a step of its own.
    assert s1 == t1
    # Step 2: the same answers again, now in the history (and the memo).
    assert t2 / s2 >= 4


def test_the_first_token_is_the_prefills_and_counts_as_a_step():
    prompts = [np.arange(10, 30, dtype=np.int32)]
    [(tokens, steps)] = replay_rollouts.replay_rollout(lookahead(), prompts, [[[7], [8, 9]]], budget=7)
    assert (tokens, steps) == (3, 3)


def test_groups_are_read_prompt_by_prompt():
    # Two prompts, groups of two: outputs[0:2] answer prompt 0, outputs[2:4] prompt 1.
    rng = np.random.default_rng(1)
    prompts = [np.arange(10, 30, dtype=np.int32), np.arange(50, 70, dtype=np.int32)]
    a, b = (rng.integers(100, 40000, 32).tolist() for _ in range(2))
    step = [a, a[:16], b, b[:16]]
    (_, s1), (_, s2) = replay_rollouts.replay_rollout(lookahead(), prompts, [step, step], budget=7)
    assert s2 < s1


def test_the_pair_oracle_is_a_ceiling_for_drafts_from_seen_text():
    # Samples of one prompt that share pieces in shuffled order: a drafter must
    # guess which piece comes next, the oracle knows it.
    rng = np.random.default_rng(2)
    prompts = [np.arange(10, 30, dtype=np.int32)]
    pieces = [rng.integers(100, 40000, 6).tolist() for _ in range(6)]
    steps = [[sum((pieces[i] for i in rng.permutation(6)), []) for _ in range(4)] for _ in range(3)]
    oracle = replay_rollouts.replay_rollout(replay_rollouts.PairOracle(), prompts, steps, budget=7)
    drafted = replay_rollouts.replay_rollout(lookahead(), prompts, steps, budget=7)
    for (t_o, s_o), (t_d, s_d) in zip(oracle, drafted):
        assert t_o == t_d and s_o <= s_d
    # Knowing which piece comes next is worth something here.
    assert sum(s for _, s in oracle) < sum(s for _, s in drafted)
    # It never drafts a pair it has not seen: a fresh prompt's unseen answer takes a step a token.
    fresh = [rng.integers(40000, 49000, 20).tolist()]
    [(tokens, count)] = replay_rollouts.replay_rollout(replay_rollouts.PairOracle(), prompts, [fresh], budget=7)
    assert count == tokens == 20
