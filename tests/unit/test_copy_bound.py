"""The hindsight bound of copying drafters (benchmarks/copy_bound.py), as worked examples."""

import numpy as np
import pytest

from copy_bound import copy_bound_steps

from lookahead.replay import replay
from lookahead.replay.baselines import LookaheadDrafter


def test_an_output_in_a_source_is_copied_a_width_at_a_time():
    # The context ends in 1; the corpus has 1 followed by the whole output.
    corpus = [[5, 1, 2, 3, 4, 5, 6, 7, 8, 9]]
    output = [2, 3, 4, 5, 6, 7, 8, 9]
    # Width 8: seven drafted tokens and the step's own, then the last one.
    assert copy_bound_steps(corpus, [0, 1], output, width=8) == 1
    assert copy_bound_steps(corpus, [0, 1], output, width=4) == 2
    assert copy_bound_steps([], [0, 1], output, width=8) == len(output)  # nothing to copy


def test_the_best_occurrence_wins_and_the_output_so_far_counts():
    # Two occurrences of 1: the second follows the output further.
    corpus = [[1, 2, 9], [1, 2, 3, 4]]
    assert copy_bound_steps(corpus, [1], [2, 3, 4], width=8) == 1
    # The output repeats itself: 1, 2 and 3 are new (a step each), the
    # second 1 follows a 3 never seen before (a step), then 2, 3 are copied
    # from the output's start.
    assert copy_bound_steps([], [7], [1, 2, 3, 1, 2, 3], width=8) == 5


def test_width_one_commits_a_token_per_step():
    assert copy_bound_steps([[1, 2, 3]], [1], [2, 3], width=1) == 2
    with pytest.raises(ValueError):
        copy_bound_steps([], [1], [2], width=0)


def test_lookahead_meets_the_bound_on_a_copy_and_passes_it_only_by_re_anchoring():
    # A prompt holding a function; the output copies it.
    rng = np.random.default_rng(0)
    body = [int(t) for t in rng.integers(10, 500, 120)]
    prompt = np.array([1, 2, 3] + body + [4], dtype=np.int32)

    def lookahead_steps(output):
        return replay(LookaheadDrafter(), [(prompt, np.array(output, dtype=np.int32))], 7).steps

    assert lookahead_steps(body) == copy_bound_steps([], prompt, body, width=8)
    # One token changed to one the prompt never had: after it the bound
    # finds nothing to copy and commits a token alone, where the trie
    # re-anchors its copy past the edit (the way the bound is not strict
    # for LOOKAHEAD, see copy_bound's docstring).
    edited = body[:60] + [7] + body[61:]
    assert lookahead_steps(edited) == copy_bound_steps([], prompt, edited, width=8) - 1
