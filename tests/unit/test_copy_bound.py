"""The hindsight bounds of copying drafters (benchmarks/copy_bound.py), as worked examples.

``prefill=False`` drafts the first output token too, as the model-free replay counts;
the default gives it a step of its own, as the benchmarks count the prefill."""

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
    assert copy_bound_steps(corpus, [0, 1], output, width=8, prefill=False) == 1
    assert copy_bound_steps(corpus, [0, 1], output, width=4, prefill=False) == 2
    assert copy_bound_steps([], [0, 1], output, width=8, prefill=False) == len(output)  # nothing to copy


def test_the_best_occurrence_wins_and_the_output_so_far_counts():
    # Two occurrences of 1: the second follows the output further.
    corpus = [[1, 2, 9], [1, 2, 3, 4]]
    assert copy_bound_steps(corpus, [1], [2, 3, 4], width=8, prefill=False) == 1
    # The output repeats itself: 1, 2 and 3 are new (a step each), the
    # second 1 follows a 3 never seen before (a step), then 2, 3 are copied
    # from the output's start.
    assert copy_bound_steps([], [7], [1, 2, 3, 1, 2, 3], width=8, prefill=False) == 5


def test_width_one_commits_a_token_per_step():
    assert copy_bound_steps([[1, 2, 3]], [1], [2, 3], width=1, prefill=False) == 2
    with pytest.raises(ValueError):
        copy_bound_steps([], [1], [2], width=0)


def test_lookahead_meets_the_bound_on_a_copy_and_passes_it_only_by_re_anchoring():
    # A prompt holding a function; the output copies it.
    rng = np.random.default_rng(0)
    body = [int(t) for t in rng.integers(10, 500, 120)]
    prompt = np.array([1, 2, 3] + body + [4], dtype=np.int32)

    def lookahead_steps(output):
        return replay(LookaheadDrafter(), [(prompt, np.array(output, dtype=np.int32))], 7).steps

    assert lookahead_steps(body) == copy_bound_steps([], prompt, body, width=8, prefill=False)
    # One token changed to one the prompt never had: after it the bound
    # finds nothing to copy and commits a token alone, where the trie
    # re-anchors its copy past the edit (the way the bound is not strict
    # for LOOKAHEAD, see copy_bound's docstring).
    edited = body[:60] + [7] + body[61:]
    assert lookahead_steps(edited) == copy_bound_steps([], prompt, edited, width=8, prefill=False) - 1
    # The edit is a token never seen before, so no pair holds it: the
    # re-anchoring bound cannot draft past it either, and LOOKAHEAD passes
    # both bounds the one way neither counts.
    assert lookahead_steps(edited) == copy_bound_steps([], prompt, edited, width=8, prefill=False, reanchor=True) - 1


def test_the_prefill_commits_the_first_token_alone():
    # The first token is the prefill's: a step of its own, no draft; the
    # other seven are then one width-8 step.
    corpus = [[5, 1, 2, 3, 4, 5, 6, 7, 8, 9]]
    output = [2, 3, 4, 5, 6, 7, 8, 9]
    assert copy_bound_steps(corpus, [0, 1], output, width=8) == 2
    assert copy_bound_steps(corpus, [0, 1], output[:1], width=8) == 1
    assert copy_bound_steps(corpus, [0, 1], [], width=8) == 0
    # Nothing to copy: a step per token either way.
    assert copy_bound_steps([], [0, 1], output, width=8) == len(output)


def test_re_anchoring_chains_copies_from_different_places():
    # 1 2 3 occurs in one source and 3 4 5 in another: no single copy has
    # 2 3 4 5, a chain of seen pairs does.
    sources = [[1, 2, 3, 9], [3, 4, 5, 9]]
    output = [2, 3, 4, 5]
    assert copy_bound_steps(sources, [1], output, width=8, prefill=False) == 2
    assert copy_bound_steps(sources, [1], output, width=8, prefill=False, reanchor=True) == 1
    # A pair never seen stops the chain: 5 never preceded 7 (7 is the step's
    # own token, and 8 takes another step).
    assert copy_bound_steps(sources, [1], output + [7, 8], width=8, prefill=False, reanchor=True) == 2
