"""``numerics.compare``: a near tie is accepted, a wrong token is not.

The answers here have the shapes ``feature_matrix`` records from a real
server (``/generate`` answers, OpenAI token records and texts); what a real
16-bit GPU run gives is ``lookahead/validate/__main__.py``'s to meet."""

from __future__ import annotations

import copy

import pytest

from lookahead.validate.numerics import compare

TOL, TIE = 0.25, 0.5


def _answer(ids, top=None, logprobs=None, finish="length"):
    rec = {"output_ids": list(ids), "text": " ".join(map(str, ids)), "finish_reason": {"type": finish},
           "completion_tokens": len(ids)}
    if logprobs is not None:
        rec["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids)]
    if top is not None:
        rec["output_top_logprobs"] = top
    return rec


def _tops(ids, runner_up, gap=1.0):
    """Top-2 logprobs at each position: the chosen token, then ``runner_up[i]`` ``gap[i]`` below."""
    gaps = gap if isinstance(gap, list) else [gap] * len(ids)
    return [[[-0.5, t, None], [-0.5 - g, r, None]] for t, r, g in zip(ids, runner_up, gaps)]


REF = [5, 6, 7, 8, 9, 10]
RUNNERS = [50, 60, 70, 80, 90, 100]


def test_identical_answers_compare_clean():
    c = compare([_answer(REF)], [_answer(REF)], [{"output_top_logprobs": _tops(REF, RUNNERS)}], TOL, TIE)
    assert c.differences == [] and c.near_ties == []


@pytest.mark.parametrize("gap,accepted", [(0.0, True), (0.3, True), (0.5, True), (0.6, False), (3.0, False)])
def test_a_divergence_is_accepted_only_at_a_near_tie(gap, accepted):
    margins = [{"output_top_logprobs": _tops(REF, RUNNERS, [1.0, 1.0, gap, 1.0, 1.0, 1.0])}]
    # LOOKAHEAD took the runner-up at token 2, and its text went on differently.
    got = _answer(REF[:2] + [70, 1, 2, 3], finish="stop")
    c = compare([_answer(REF)], [got], margins, TOL, TIE, where="case")
    if accepted:
        assert c.differences == [] and c.near_ties == [("case[0]", 2, pytest.approx(gap))]
    else:
        assert c.near_ties == [] and len(c.differences) == 1 and "token 2" in c.differences[0]


def test_a_token_the_reference_did_not_rank_is_a_difference():
    margins = [{"output_top_logprobs": _tops(REF, RUNNERS, 0.0)}]
    c = compare([_answer(REF)], [_answer(REF[:3] + [999, 1, 2])], margins, TOL, TIE)
    assert c.near_ties == [] and "not in the reference's top tokens" in c.differences[0]


def test_without_margins_every_divergence_is_a_difference():
    c = compare([_answer(REF)], [_answer(REF[:3] + [80, 1, 2])], None, TOL, TIE)
    assert c.near_ties == [] and len(c.differences) == 1


def test_a_different_length_on_the_same_tokens_is_a_difference():
    c = compare([_answer(REF)], [_answer(REF[:4], finish="stop")], [{"output_top_logprobs": _tops(REF, RUNNERS, 0.0)}],
                TOL, TIE)
    assert c.near_ties == [] and "identical up to token 4" in c.differences[0]


def test_logprobs_count_up_to_the_divergence_within_the_tolerance():
    lps = [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]
    top = _tops(REF, RUNNERS, [1.0, 1.0, 0.1, 1.0, 1.0, 1.0])
    expected = _answer(REF, top=top, logprobs=lps)
    got = copy.deepcopy(expected)
    got["output_token_logprobs"][1][0] += 0.2  # within 0.25
    got["output_ids"][2:] = [70, 1, 2, 3]
    got["output_token_logprobs"][4][0] -= 5.0  # after the divergence: not compared
    c = compare([expected], [got], None, TOL, TIE)  # the answer's own top logprobs are its margins
    assert c.differences == [] and [t[1] for t in c.near_ties] == [2]
    assert c.max_logprob_deviation == pytest.approx(0.2)
    got["output_token_logprobs"][0][0] += 0.3  # before it, beyond the tolerance
    assert len(compare([expected], [got], None, TOL, TIE).differences) == 1


def test_runners_up_may_swap_only_where_they_tie():
    expected = _answer(REF[:2], top=[[[-0.5, 5, None], [-1.0, 50, None], [-1.1, 51, None]],
                                     [[-0.5, 6, None], [-1.0, 60, None], [-4.0, 61, None]]])
    got = copy.deepcopy(expected)
    got["output_top_logprobs"][0][1:] = [[-1.05, 51, None], [-1.05, 50, None]]  # a near tie below the top
    assert compare([expected], [got], None, TOL, TIE).differences == []
    got["output_top_logprobs"][1][1] = [-1.0, 61, None]  # the reference had 61 three nats lower
    assert len(compare([expected], [got], None, TOL, TIE).differences) == 1


def _records(tokens, gap=1.0, runner="Z"):
    return [(t, -0.2, [(t, -0.2), (runner, -0.2 - gap)]) for t in tokens]


def test_openai_token_records_part_at_a_near_tie():
    expected = _records(["a", "b", "c", "d"], gap=0.2)
    got = _records(["a", "b", "Z", "q"], gap=0.2)
    got[2] = ("Z", -0.2, [("Z", -0.2), ("c", -0.4)])
    c = compare(expected, got, None, TOL, TIE, where="chat")
    assert c.differences == [] and c.near_ties == [("chat", 2, pytest.approx(0.2))]
    far = compare(_records(["a", "b", "c"], gap=2.0), _records(["a", "b", "Z"], gap=2.0), None, TOL, TIE)
    assert len(far.differences) == 1


def test_a_text_parts_where_the_reference_ranked_the_other_token_close():
    tokens = [("{\"", -0.1, [("{\"", -0.1), ("{", -3.0)]), ("name", -0.2, [("name", -0.2), ("count", -0.3)]),
              ("\":", -0.1, [("\":", -0.1), ("\"", -5.0)])]
    expected = "{\"name\":"
    c = compare(expected, "{\"count\": 3}", tokens, TOL, TIE, where="json")
    assert c.differences == [] and c.near_ties == [("json", 1, pytest.approx(0.1))]
    c = compare(expected, "{\"tags\": []}", tokens, TOL, TIE, where="json")
    assert c.near_ties == [] and len(c.differences) == 1


def test_a_completion_compares_its_logprobs_up_to_where_its_text_parted():
    tokens = [("x", -0.1, [("x", -0.1), ("y", -0.2)]), (" =", -0.1, [(" =", -0.1), (" +", -4.0)])]
    expected = ["x =", [-0.1, -0.1]]
    assert compare(expected, ["y = 1", [-0.12, -3.0]], tokens, TOL, TIE).differences == []
    assert len(compare(expected, ["x +", [-0.1, -4.0]], tokens, TOL, TIE).differences) == 1


def test_each_answer_of_a_case_is_compared_with_its_own_margins():
    # long_prompt: the same request twice; the second answer parts at a near tie.
    expected = [_answer(REF), _answer(REF)]
    margins = [{"output_top_logprobs": _tops(REF, RUNNERS, 3.0)}, {"output_top_logprobs": _tops(REF, RUNNERS, 0.1)}]
    c = compare(expected, [_answer(REF), _answer(REF[:1] + [60, 0])], margins, TOL, TIE, where="long")
    assert c.differences == [] and c.near_ties == [("long[1]", 1, pytest.approx(0.1))]
    c = compare(expected, [_answer(REF[:1] + [60, 0]), _answer(REF)], margins, TOL, TIE)
    assert c.near_ties == [] and len(c.differences) == 1


# --- every emitted token, teacher-forced (numerics.check_teacher_forced) ---

from lookahead.validate.numerics import (  # noqa: E402
    TEACHER_FORCED_MARGIN, check_teacher_forced, lossy_output, token_gaps)


def _forced(ids, best, gaps, runners=None, runner_gaps=None):
    """A teacher-forced prefill's input logprobs over a 2-token prompt and
    ``ids``: the emitted token ``gaps[k]`` below the best ``best[k]``."""
    runners = runners or [900 + k for k in range(len(ids))]
    runner_gaps = runner_gaps or [2.0] * len(ids)
    token_lps = [[None, 1, None], [-1.0, 2, None]]
    tops = [None, [[-1.0, 2, None]]]
    for t, b, g, r, rg in zip(ids, best, gaps, runners, runner_gaps):
        token_lps.append([-0.5 - g, t, None])
        top = [[-0.5, b, None], [-0.5 - (g if t != b else rg), t if t != b else r, None]]
        tops.append(top)
    return token_gaps(token_lps, tops, ids)


def test_argmax_tokens_and_near_ties_pass_every_position():
    ids = [5, 6, 7, 8]
    gaps = _forced(ids, [5, 60, 7, 80], [0.0, 0.1, 0.0, TEACHER_FORCED_MARGIN])
    c = check_teacher_forced([(ids, gaps)])
    assert c.passed and c.tokens == 4 and c.argmax == 2 and [k for _, k, _ in c.near] == [1, 3]


def test_a_token_beyond_the_margin_fails_wherever_it_is():
    # Not the first difference from anything: the fourth token, after a near tie.
    ids = [5, 6, 7, 8]
    gaps = _forced(ids, [5, 60, 7, 80], [0.0, 0.1, 0.0, 0.28])
    c = check_teacher_forced([(ids, gaps)])
    assert not c.passed and c.violations == [(0, 3, pytest.approx(0.28))]


def test_the_lossy_output_takes_the_first_runner_up_between_the_margin_and_0_3():
    ids = [5, 6, 7, 8]
    gaps = _forced(ids, ids, [0.0] * 4, runners=[50, 60, 70, 80], runner_gaps=[0.1, 0.35, 0.27, 0.29])
    assert lossy_output(ids, gaps) == [5, 6, 70]
    assert lossy_output(ids[:2], gaps[:2]) is None


def test_misaligned_logprobs_are_refused():
    gaps_in = [[None, 1, None], [-0.5, 9, None]]
    with pytest.raises(ValueError, match="scores token 9"):
        token_gaps(gaps_in, [None, [[-0.5, 9, None]]], [5])


def test_float_noise_on_the_margin_is_within_it():
    ids = [5, 6]
    gaps = _forced(ids, [5, 60], [0.0, TEACHER_FORCED_MARGIN + 6e-8])
    assert check_teacher_forced([(ids, gaps)]).passed
    # ... and is no lossy acceptance either.
    noisy = _forced(ids, ids, [0.0, 0.0], runners=[50, 60], runner_gaps=[TEACHER_FORCED_MARGIN + 6e-8, 0.35])
    assert lossy_output(ids, noisy) is None
    assert lossy_output(ids, noisy, high=0.4) == [5, 60]
