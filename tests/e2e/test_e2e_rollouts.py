"""RL rollouts in real SGLang (``sgl.Engine``, CPU, tiny model): what a
training loop does between rollouts keeps LOOKAHEAD's history, and sampled
requests really sample, LOOKAHEAD's and NGRAM's alike.

An RL framework (verl, slime) calls ``update_weights_from_tensor``,
``update_weights_from_distributed`` (a trainer's broadcast) or
``update_weights_from_disk`` after each training step, ``flush_cache``, and
``release_memory_occupation`` / ``resume_memory_occupation`` around
training. The same prompts come back at the next step, and their earlier
rollouts are what LOOKAHEAD drafts them from: each call must leave the
history in place (``internal_states[0]["lookahead"]["trie"]``: its tokens,
and the earlier answer found again when the prompt comes back), and
``speculative_lookahead_clear_history`` (``/set_internal_state``) must
empty it.
"""

from __future__ import annotations

import itertools

import pytest

from e2e_driver import run_driver

GREEDY = {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True}
GROUP = {"temperature": 1.0, "top_k": 2, "max_new_tokens": 24, "ignore_eos": True}
ENGINE = {"max_total_tokens": 8192, "max_running_requests": 8}
LOOKAHEAD = {"speculative_algorithm": "LOOKAHEAD", "speculative_num_draft_tokens": 8, **ENGINE}
PROMPT = "Q: what is 12 + 30? Show your work.\nA:"
# "release_resume" is release_memory_occupation then resume_memory_occupation
# (every tag: KV cache, weights, graphs), as a colocated trainer makes them.
CALLS = ("update_weights_from_tensor", "update_weights_from_distributed", "update_weights_from_disk", "flush_cache",
         "release_resume")


@pytest.fixture(scope="module")
def runs(tiny_model, cpu_subprocess_env, tmp_path_factory):
    prompts = [PROMPT] * 9
    group = list(range(1, 9))  # eight requests of the same question, as verl sends a group
    # The rollout run serves the prompt, makes one call, serves it again, and
    # so on; then clears the history and serves it once more.
    served = len(CALLS) + 2
    calls = {str(i): [c] for i, c in enumerate(CALLS)}
    calls[str(len(CALLS))] = ["clear_history"]
    spec = {"model": tiny_model, "prompts": prompts, "runs": [
        {"name": "rollout", "engine": LOOKAHEAD, "sampling": GREEDY, "groups": [[0]] * served,
         "calls": calls, "server_info": ["lookahead"]},
        # A group of samples of one question, twice (two training steps).
        {"name": "lookahead-group", "engine": LOOKAHEAD, "sampling": {**GROUP, "top_k": 1 << 30},
         "groups": [group, group], "calls": {"0": ["update_weights_from_tensor"]}},
        {"name": "ngram-group", "engine": {**ENGINE, "speculative_algorithm": "NGRAM",
                                           "speculative_num_draft_tokens": 8},
         "sampling": GROUP, "groups": [group]},
    ]}
    return run_driver(spec, tmp_path_factory.mktemp("rollouts"), cpu_subprocess_env, timeout=1200)


def _trie(info: dict) -> dict:
    return info["lookahead"]["trie"]


@pytest.mark.parametrize("call", CALLS)
def test_history_survives(runs, call):
    infos = runs["runs"]["rollout"]["server_info"]
    i = CALLS.index(call)
    before = _trie(infos[i - 1]) if i else None
    after, next_serving = _trie(infos[i]), _trie(infos[i + 1])
    # The call itself drops nothing (the info after group i is read after the call) ...
    assert after["shared_tokens"] > 0
    if before is not None:
        assert after["shared_tokens"] >= before["shared_tokens"]
    # ... and the prompt served again finds its earlier answer.
    assert next_serving["answers_followed"] == after["answers_followed"] + 1


def test_served_again_after_every_call_drafts_its_answer(runs):
    outs = runs["runs"]["rollout"]["group_outputs"]
    # The weights changed twice, so answers may change; each serving after
    # the first still drafts from the history (its answer, or the one before).
    for serving in outs[1: len(CALLS) + 1]:
        assert serving["0"]["spec_accept_length"] > 1.5, serving


def test_clear_history_empties_it(runs):
    infos = runs["runs"]["rollout"]["server_info"]
    cleared, last = _trie(infos[len(CALLS)]), _trie(infos[len(CALLS) + 1])
    assert cleared["shared_tokens"] == 0 and cleared["answers_remembered"] == 0
    # Served once more, the prompt finds nothing remembered.
    assert last["answers_followed"] == cleared["answers_followed"]
    assert last["shared_tokens"] > 0  # and the history fills again


def test_lookahead_group_samples(runs):
    # Two training steps of a group of eight samples of one question: every
    # sample is decoded in full and verified, and they are samples (not one
    # answer eight times).
    for g in runs["runs"]["lookahead-group"]["group_outputs"]:
        outs = [o["output_ids"] for o in g.values()]
        assert len(outs) == 8 and len({tuple(o) for o in outs}) > 1
        assert all(len(o) == GROUP["max_new_tokens"] for o in outs)
        assert all(o["spec_verify_ct"] > 0 for o in g.values())


def test_ngram_samples_on_cpu(runs):
    """Stock SGLang 0.5.23 verifies NGRAM greedily on CPU: samples that share
    their first token (drawn at prefill) stay identical to the end. With the
    CPU environment's sampled verify they part, as plain decoding's do."""
    outs = [o["output_ids"] for o in runs["runs"]["ngram-group"]["outputs"].values()]
    assert len(outs) == 8
    same_start = [(a, b) for a, b in itertools.combinations(outs, 2) if a[0] == b[0]]
    assert same_start, "top-k 2 over eight samples: some share their first token"
    assert any(a != b for a, b in same_start), "NGRAM decoded greedily after the first token"
    assert all(o["spec_verify_ct"] > 0 for o in runs["runs"]["ngram-group"]["outputs"].values())
