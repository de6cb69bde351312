"""A prompt served before starts its draft with the answer it got then
(``lookahead.trie.answers``): worked examples."""

from __future__ import annotations

import pytest

from trie_helpers import open_cache

pytestmark = pytest.mark.unit

# An agent's conversation: every turn ends in the same shell prompt and chat
# template, longer than a draft reads back (max_match_len 64).
BOILERPLATE = list(range(500, 580))


def conversation(task: int, turns: int) -> list:
    out = []
    for t in range(turns):
        out += [1000 + 10 * task + t] * 3 + BOILERPLATE + [2000 + 10 * task + t] * 5
    return out


def prompt_of(task: int) -> list:
    # The task's fifth turn: its four turns so far, then the new tool output.
    return conversation(task, 4) + [1000 + 10 * task + 4] * 3 + BOILERPLATE


def serve(cache, rid, prompt, answer, scope=None):
    cache.put_prompt(rid, prompt, scope=scope)
    cache.put_output(rid, answer)
    cache.finish(rid)


def test_the_same_conversation_again_drafts_its_earlier_answer_from_the_first_token():
    """Ten tasks' turns all end in the same 80 tokens, so a draft after the
    prompt's end cannot tell which earlier turn it continues: without the
    memo, task 3's retry drafts another turn's answer.  With it, the retry
    drafts the answer task 3 got, from its first token, a chain as long as
    the budget; and once the retry's output parts from that answer (a
    sampled token), the memo is let go."""
    prompt = prompt_of(3)
    answer = list(range(7000, 7040))
    for remember, expected in ((8192, answer[:8]), (0, None)):
        with open_cache(max_memory_bytes=1 << 20, remember_answers=remember) as cache:
            for task in range(10):
                serve(cache, f"t{task}", prompt_of(task), answer if task == 3 else list(range(8000 + 100 * task, 8040 + 100 * task)))
            cache.put_prompt("retry", prompt)
            cache.synchronize()
            draft = cache.draft("retry", prompt, 8)
            if expected is None:
                assert draft.tokens[:8] != answer[:8]
                continue
            assert draft.tokens == expected and draft.parents == list(range(-1, 7))
            assert cache.stats()["answers_followed"] == 1
            # Followed while the output follows it ...
            cache.put_output("retry", answer[:5])
            assert cache.draft("retry", prompt + answer[:5], 8).tokens == answer[5:13]
            # ... let go once it parts.
            cache.put_output("retry", [9999])
            cache.draft("retry", prompt + answer[:5] + [9999], 8)
            assert cache._requests["retry"].answer is None


def test_a_context_ahead_of_the_cache_is_followed_from_where_it_ends():
    """In an overlapped step the context already holds committed tokens the
    cache has not been given yet: the answer is followed from where the
    context ends, not from what the cache holds."""
    prompt = [5, 6, 7, 8]
    answer = list(range(100, 140))
    with open_cache(max_memory_bytes=1 << 20) as cache:
        serve(cache, "first", prompt, answer)
        cache.put_prompt("again", prompt)
        cache.put_output("again", answer[:2])
        cache.synchronize()
        # Given 2 output tokens; the context ends 3 tokens further on.
        assert cache.draft("again", prompt + answer[:5], 4).tokens == answer[5:9]
        # A context read from the tail only (as the worker passes it) is the same.
        assert cache.draft("again", (prompt + answer[:5])[-3:], 4).tokens == answer[5:9]


def test_answers_stay_in_their_scope():
    """A tenant asking what another tenant asked drafts nothing of its answer;
    a request that shares nothing neither feeds nor reads the memo."""
    prompt = [5, 6, 7, 8]
    answer = list(range(100, 140))
    with open_cache(max_memory_bytes=1 << 20) as cache:
        serve(cache, "a", prompt, answer, scope="cache_salt:alice")
        cache.put_prompt("b", prompt, scope="cache_salt:bob")
        cache.put_prompt("p", prompt, share=False)
        cache.put_prompt("a2", prompt, scope="cache_salt:alice")
        cache.synchronize()
        assert set(cache.draft("b", prompt, 8).tokens).isdisjoint(answer)
        assert set(cache.draft("p", prompt, 8).tokens).isdisjoint(answer)
        assert cache.draft("a2", prompt, 8).tokens == answer[:8]


def test_the_memo_is_bounded_and_keeps_the_latest_answer():
    """At most ``remember_answers`` prompts are remembered, the least recently
    used let go first; a prompt answered again remembers its latest answer."""
    with open_cache(max_memory_bytes=1 << 20, remember_answers=2) as cache:
        for i in range(3):
            serve(cache, f"q{i}", [i, 50, 51], list(range(100 * (i + 1), 100 * (i + 1) + 20)))
        serve(cache, "q1-again", [1, 50, 51], list(range(900, 920)))
        assert cache.stats()["answers_remembered"] == 2
        for i, expected in ((0, None), (1, list(range(900, 904))), (2, list(range(300, 304)))):
            cache.put_prompt(f"r{i}", [i, 50, 51])
            cache.synchronize()
            draft = cache.draft(f"r{i}", [i, 50, 51], 4)
            assert (draft.tokens == expected) if expected else draft.tokens[:4] != [100, 101, 102, 103]
