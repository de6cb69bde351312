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
