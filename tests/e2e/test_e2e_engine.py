"""LOOKAHEAD in real SGLang (``sgl.Engine`` on the CPU engine, tiny model).

Lossless is the contract: under greedy sampling every output token must equal
plain decoding's, for every configuration: one-branch and multi-branch trees,
verify widths 2, 4 and 8, and batches of 1, 2, 4 and 6 requests (6 exceeds
the default ``--speculative-lookahead-max-batch-size`` of 4, so those steps
take the plain-decode fallback).  The speculative path must also really run:
``spec_verify_ct`` is reported and drafts get accepted.

All engines run once, in one subprocess (see ``e2e_driver.py``), and the
tests below read its results.
"""

from __future__ import annotations

import pytest

from e2e_driver import prompts, run_driver

GREEDY = {"temperature": 0.0, "max_new_tokens": 40, "ignore_eos": True}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": 24, "ignore_eos": True}
# Submitted group by group: batches of 1, 2, 4, 6 (fallback), 6, then 1 and 4.
BATCHES = [1, 2, 4, 6, 6, 1, 4]
ENGINE = {"max_total_tokens": 12288, "max_running_requests": 8}
WIDTHS = (2, 4, 8)


def _groups(n_prompts: int) -> list[list[int]]:
    groups, start = [], 0
    for size in BATCHES:
        if start >= n_prompts:
            break
        groups.append(list(range(start, min(start + size, n_prompts))))
        start += size
    assert start >= n_prompts, "every prompt is submitted"
    return groups


def _lookahead(width: int, one_branch: bool) -> dict:
    return {"speculative_algorithm": "LOOKAHEAD", "speculative_num_draft_tokens": width,
            "speculative_one_branch": one_branch, **ENGINE}


@pytest.fixture(scope="module")
def runs(tiny_model, cpu_subprocess_env, tmp_path_factory):
    n = len(prompts())
    groups = _groups(n)
    spec = {"model": tiny_model, "runs": [{"name": "plain", "engine": ENGINE, "sampling": GREEDY, "groups": groups}]}
    for width in WIDTHS:
        for one_branch in (False, True):
            name = f"w{width}-{'chain' if one_branch else 'tree'}"
            spec["runs"].append({"name": name, "engine": _lookahead(width, one_branch), "sampling": GREEDY,
                                 "groups": groups})
    # Speculation decided per step from measured costs, across the same batches.
    spec["runs"].append({"name": "auto", "engine": {**_lookahead(8, False),
                                                   "speculative_lookahead_max_batch_size": "auto"},
                         "sampling": GREEDY, "groups": groups})
    spec["runs"].append({"name": "sampled", "engine": _lookahead(4, False), "sampling": SAMPLED,
                         "groups": [[0, 1, 2, 3], [4]]})
    tmp = tmp_path_factory.mktemp("e2e")
    # --speculative-lookahead-path: the first engine saves its trie, the second loads it.
    trie = str(tmp / "trie.npz")
    for name in ("saved", "loaded"):
        spec["runs"].append({"name": name, "engine": {**_lookahead(4, False), "speculative_lookahead_path": trie},
                             "sampling": GREEDY, "groups": [[0, 1], [2]]})
    result = run_driver(spec, tmp, cpu_subprocess_env, timeout=2400)
    result["groups"] = groups
    result["trie_path"] = trie
    return result


def test_enough_prompts_and_batches():
    texts = prompts()
    assert len(texts) >= 20
    assert max(len(t) for t in texts) > 800 and min(len(t) for t in texts) < 5
    sizes = [len(g) for g in _groups(len(texts))]
    assert {1, 2, 4, 6} <= set(sizes)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_greedy_output_identical_to_plain_decoding(runs, width, mode):
    plain = runs["runs"]["plain"]["outputs"]
    spec = runs["runs"][f"w{width}-{mode}"]["outputs"]
    assert set(spec) == set(plain) and len(plain) >= 20
    for group in runs["groups"]:
        for i in group:
            expected, got = plain[str(i)]["output_ids"], spec[str(i)]["output_ids"]
            assert len(expected) == GREEDY["max_new_tokens"]
            assert got == expected, f"prompt {i} (batch of {len(group)}) differs from plain decoding"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_speculation_ran_and_was_accepted(runs, width, mode):
    spec = runs["runs"][f"w{width}-{mode}"]["outputs"]
    assert all(o["spec_verify_ct"] and o["spec_verify_ct"] > 0 for o in spec.values())
    # Every step commits at least one token, so accept length >= 1 always.
    assert all(o["spec_accept_length"] >= 1.0 for o in spec.values())
    if width > 2:
        assert max(o["spec_accept_length"] for o in spec.values()) > 1.5


def test_acceptance_on_copy_heavy_prompt(runs):
    # The tiny random model loops; once it does, the trie predicts it.
    loop_prompt = prompts().index("import os\nimport sys\nimport os\nimport sys\nimport os\nimport sys\n")
    out = runs["runs"]["w8-tree"]["outputs"][str(loop_prompt)]
    assert out["spec_verify_ct"] > 0
    assert out["spec_accept_length"] > 1.5, out


def test_auto_cut_off_is_lossless(runs):
    plain, auto = runs["runs"]["plain"]["outputs"], runs["runs"]["auto"]["outputs"]
    assert set(auto) == set(plain)
    for i in plain:
        assert auto[i]["output_ids"] == plain[i]["output_ids"], f"prompt {i} differs from plain decoding"
    assert max(o["spec_accept_length"] for o in auto.values()) > 1.5


def test_plain_decoding_reports_no_verify_steps(runs):
    assert all(not o["spec_verify_ct"] for o in runs["runs"]["plain"]["outputs"].values())


def test_sampled_requests_complete(runs):
    outs = runs["runs"]["sampled"]["outputs"]
    assert len(outs) == 5
    for o in outs.values():
        assert len(o["output_ids"]) == SAMPLED["max_new_tokens"]
        assert all(0 <= t < 2048 for t in o["output_ids"])
        assert o["spec_verify_ct"] > 0


def test_no_engine_process_left(runs):
    import psutil

    alive = [p for p in runs["engine_pids"] if psutil.pid_exists(p)]
    alive = [p for p in alive if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"engine processes still running: {alive}"


def test_trie_is_saved_and_loaded_across_restarts(runs):
    from lookahead import LookaheadCache

    cache = LookaheadCache.load(runs["trie_path"])
    stats = cache.stats()
    cache.close()
    # The first engine's outputs (3 prompts x 40 tokens) are in the saved history...
    assert stats["shared_tokens"] >= 3 * GREEDY["max_new_tokens"]
    # ... and an engine started from it stays lossless.
    plain = runs["runs"]["plain"]["outputs"]
    for name in ("saved", "loaded"):
        for i, out in runs["runs"][name]["outputs"].items():
            assert out["output_ids"] == plain[i]["output_ids"], (name, i)
            assert out["spec_verify_ct"] > 0
