"""What each drafting mechanism is for, shown on hand-made streams.

Copy re-anchoring after an edit, the copy cursor, drafting past tokens
never seen, the wildcard alternatives of requests that are not copying,
their own output over their prompt, and matching past one mismatch: each
test shows the draft with the mechanism and without it (its tuning value
set to off), and re-anchoring is also held to the reference model.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from trie_helpers import configure, open_cache, replay_against_reference  # noqa: E402


def test_copy_resumes_at_its_source_after_an_edit():
    """After a substituted token, the context's last token also occurs later
    in the prompt (and, more recent, wins a tie of 1-token matches); copy
    re-anchoring finds where the text before the edit was copied from and
    resumes the copy there."""
    source = list(range(1000, 1130))
    source[30] = source[101] = 7
    edited = source[:29] + [5000, 7]  # source[29] replaced, then the copy goes on
    for one_branch in (True, False):
        with open_cache(max_memory_bytes=1 << 20) as cache:
            cache.put_prompt("edit", source + [1])
            cache.put_output("edit", edited)
            cache.synchronize()
            assert cache.draft("edit", source + [1] + edited, 4, one_branch).tokens[:4] == source[31:35]
        # Control: no anchoring, and no matching past the edited token (which
        # would find the copy source too).
        with open_cache(max_memory_bytes=1 << 20, anchor_window=0, mismatch_weight=0.0) as cache:
            cache.put_prompt("edit", source + [1])
            cache.put_output("edit", edited)
            cache.synchronize()
            # The tie of 1-token matches goes to the most recent occurrence.
            assert cache.draft("edit", source + [1] + edited, 4, one_branch).tokens[0] == source[102]


def test_drafts_follow_the_copy_being_made():
    """A block recurs four times in the source, three times followed by the
    same tokens; the output, after an edit, copies the fourth occurrence.  On
    match weight alone the three outvote it; the copy cursor, which has
    followed the fourth occurrence token by token, keeps the draft on it."""
    block = list(range(100, 125))
    usual, fourth = [200, 201, 202, 203], [300, 301, 302, 303]
    prompt = ([1, 11] + block + usual + [2, 12] + block + usual + [3, 13] + block + usual
              + [4, 14] + block + fourth + [5])
    output = [9, 14] + block  # 9: the edit, where the source has 4
    for copy_boost, expected in ((0.0, usual), (4.0, fourth)):
        with open_cache(max_memory_bytes=1 << 20, copy_boost=copy_boost) as cache:
            cache.put_prompt("r", prompt)
            cache.synchronize()
            context = list(prompt)
            for token in output:  # one token per step and a draft after each, as in serving
                cache.put_output("r", [token])
                context.append(token)
                draft = cache.draft("r", context, 4, one_branch=True)
            assert draft.tokens == expected
            # The same draft again (no new tokens) gives the same answer.
            assert cache.draft("r", context, 4, one_branch=True).tokens == expected


def test_a_request_asked_again_follows_its_earlier_answer():
    """The same prompt again (a retry, "regenerate"): the earlier answer copied
    the prompt, left it where the prompt's text reappears a little further on,
    then went on in words of its own.  At that point the own store matches
    only the two tokens after the divergence, so re-anchoring would resume
    the prompt's copy there; but the scope's history holds the earlier
    answer, which matches the whole context verbatim: it wins, and the draft
    follows the answer, not the guess."""
    text = list(range(1000, 1100))
    prompt = [1] + text + [2, 3]
    own_words = list(range(9000, 9010))
    answer = text[:70] + text[80:82] + own_words
    asked_again = prompt + answer[:72]
    for one_branch in (False, True):
        with open_cache(max_memory_bytes=1 << 20) as cache:
            cache.put_prompt("first", prompt)
            cache.put_output("first", answer)
            cache.finish("first")
            cache.put_prompt("again", prompt)
            cache.put_output("again", answer[:72])
            cache.synchronize()
            assert cache.draft("again", asked_again, 4, one_branch).tokens[:4] == own_words[:4]
            # Without that history the guess is all there is, and it is taken.
            cache.put_prompt("alone", prompt, share=False)
            cache.put_output("alone", answer[:72])
            cache.synchronize()
            assert cache.draft("alone", asked_again, 4, one_branch).tokens[:4] == text[82:86]


def test_draft_past_tokens_never_seen():
    """A context ending in a token seen nowhere (a new name) still gets the
    draft that followed the tokens before it, one token on; two new tokens
    need ``wildcard_tokens`` 2.  With 0 nothing is drafted."""
    prompt = [7, 1, 2, 3, 50, 4, 5, 6, 8, 11, 12, 13, 60, 61, 40, 41, 42, 9]
    for one_branch in (False, True):
        for context, wildcard_tokens, expected in (
            ([1, 2, 3, 99], 1, [4, 5, 6]),     # 99 stands where 50 was: go on after 50
            ([1, 2, 3, 99], 0, []),
            ([11, 12, 13, 98, 99], 1, []),     # two new tokens
            ([11, 12, 13, 98, 99], 2, [40, 41, 42]),  # ... stand where 60, 61 were
        ):
            with open_cache(max_memory_bytes=1 << 20, wildcard_tokens=wildcard_tokens) as cache:
                cache.put_prompt("r", prompt)
                cache.put_output("r", context)
                cache.synchronize()
                draft = cache.draft("r", prompt + context, 3, one_branch)
                assert draft.tokens == expected, (context, wildcard_tokens, one_branch, draft)
                if expected:
                    assert draft.parents == [-1, 0, 1]


def feed_at_pace(cache, rid, context: list, tokens: list, per_step: int, budget: int):
    """Give ``rid`` its ``tokens`` ``per_step`` at a time with a draft after
    each, as a server does (this sets the request's pace); ``context`` grows
    in place.  Returns the last draft."""
    draft = None
    for i in range(0, len(tokens), per_step):
        cache.put_output(rid, tokens[i:i + per_step])
        context += tokens[i:i + per_step]
        draft = cache.draft(rid, context, budget)
    return draft


def test_wildcard_alternatives_only_for_requests_that_advance_slowly():
    """A request whose drafts advance it about one token per step (not
    copying) also gets, at a low weight, what followed the token before its
    last one elsewhere, one token on (here 50); a request advancing several
    tokens per step (copying) keeps the whole budget for its copy."""
    prompt = [1, 6, 7, 30, 31, 32, 33, 2, 10, 99, 50, 51, 3]
    filler = list(range(60, 92))
    for per_step, expected in ((1, [7, 30, 31, 50]), (8, [7, 30, 31, 32])):
        with open_cache(max_memory_bytes=1 << 20, copy_boost=0.0) as cache:
            cache.put_prompt("r", prompt)
            cache.synchronize()
            context = list(prompt)
            feed_at_pace(cache, "r", context, filler, per_step, 4)
            cache.put_output("r", [10, 6])
            assert cache.draft("r", context + [10, 6], 4).tokens == expected


def test_own_output_weighs_more_while_not_copying():
    """Two occurrences in the prompt say 50 follows 40 41; one in the
    request's output says 60.  A request advancing a token per draft (not
    copying) weighs its own output ``output_weight`` times its prompt, so at
    3 the output's continuation wins; one advancing 8 tokens per draft
    (copying) keeps the prompt's, its source."""
    prompt = [1, 40, 41, 50, 51, 2, 40, 41, 50, 51, 3]
    output = list(range(100, 116)) + [5, 40, 41, 60, 61, 6, 40, 41]
    isolate = dict(copy_boost=0.0, mismatch_weight=0.0, anchor_window=0, wildcard_weight=0.0)
    for output_weight, per_step, expected in ((1.0, 1, 50), (3.0, 1, 60), (3.0, 8, 50)):
        with open_cache(max_memory_bytes=1 << 20, output_weight=output_weight, **isolate) as cache:
            cache.put_prompt("r", prompt)
            cache.synchronize()
            context = list(prompt)
            draft = feed_at_pace(cache, "r", context, output, per_step, 2)
            assert draft.tokens[0] == expected, (output_weight, per_step, draft)
            assert cache.draft("r", context, 2, one_branch=True).tokens == [expected, expected + 1]


def test_matches_go_on_past_one_mismatch_in_the_own_stream():
    """Two occurrences of the context's last two tokens in the request's own
    stream: the older one also matches the four tokens before them but for
    one edited token (77 where the source has 5).  Matching past that
    mismatch makes it the likelier copy; without it the tie goes to the more
    recent occurrence."""
    prompt = [1, 2, 3, 4, 5, 50, 60, 70, 71, 8, 9, 50, 60, 80, 81, 99]
    output = [1, 2, 3, 4, 77, 50, 60]
    for mismatch_weight, expected in ((0.0, [80, 81]), (0.5, [70, 71])):
        with open_cache(max_memory_bytes=1 << 20, mismatch_weight=mismatch_weight) as cache:
            cache.put_prompt("r", prompt)
            cache.put_output("r", output)
            cache.synchronize()
            assert cache.draft("r", prompt + output, 2, one_branch=True).tokens == expected
            assert cache.draft("r", prompt + output, 2).tokens[0] == expected[0]


def test_reference_on_copies_with_edits():
    """Native drafts equal the reference model's on copy-with-edit streams,
    where re-anchoring fires (substitutions, insertions, deletions)."""
    rng = random.Random(1)
    configs = [{}, {"orders": (1, 2, 3)}, {"anchor_min": 8, "anchor_window": 40}]
    for seed, overrides in enumerate(configs):
        requests = []
        for _ in range(2):
            src = [rng.randrange(30) for _ in range(200)]
            resp = list(src)
            for _ in range(4):
                i, kind = rng.randrange(len(resp)), rng.randrange(3)
                if kind == 0:
                    resp[i] = rng.randrange(30)
                elif kind == 1:
                    resp[i:i] = [rng.randrange(30) for _ in range(rng.randrange(1, 13))]
                else:
                    del resp[i:i + rng.randrange(1, 30)]
            requests.append((src + [rng.randrange(30) for _ in range(5)], resp))
        cfg, tuning = configure(max_memory_bytes=1 << 18, **overrides)
        nonempty, _ = replay_against_reference(cfg, requests, seed=seed, tuning=tuning)
        assert nonempty > 100
