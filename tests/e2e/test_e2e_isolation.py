"""Tenant isolation in real SGLang (``sgl.Engine`` on the CPU engine, tiny model).

Request A (``cache_salt`` "alice") generates a text; three requests then ask
to continue it, each prompted with A's prompt and the first 40 tokens A
generated: salt "bob", salt "alice", no salt.  Every draft is logged by the
cache (``LOOKAHEAD_DRAFT_LOG``) with the request it was drafted for and the
context, so the tests see, draft by draft and not by timing, whose text it
came from:

* ``--speculative-lookahead-isolation salt`` (the default): bob's and the
  unsalted request's drafts all come from their own prompt and output; the
  second "alice" request's also come from A's text;
* ``none``: every request drafts from every earlier one;
* ``request``: each request only from its own prompt and output;

and under each mode every output equals plain decoding's.  The four
engines run once, in one subprocess (``isolation_driver.py``).
"""

from __future__ import annotations

import pytest

from draft_paths import drafts_with_own_streams, unexplained_paths
from e2e_driver import run_driver

ENGINE = {"max_total_tokens": 8192, "max_running_requests": 4}
MODES = ("salt", "none", "request")
GUESSERS = ("bob", "alice", "nobody")  # in the order they run; salts "bob", "alice", none

# Besides its own prompt and output, whose text each guesser may draft from.
MAY_DRAFT_FROM = {
    "salt": {"bob": [], "alice": ["A"], "nobody": []},
    "none": {"bob": ["A"], "alice": ["A", "bob"], "nobody": ["A", "bob", "alice"]},
    "request": {"bob": [], "alice": [], "nobody": []},
}
# The scope each request's drafts are logged with.
SCOPES = {
    "salt": {"A": "cache_salt:alice", "bob": "cache_salt:bob", "alice": "cache_salt:alice", "nobody": None},
    "none": dict.fromkeys(("A",) + GUESSERS),
    "request": dict.fromkeys(("A",) + GUESSERS),
}


@pytest.fixture(scope="module")
def scenario(tiny_model, cpu_subprocess_env, tmp_path_factory):
    runs = [{"name": "plain", "engine": ENGINE}]
    for mode in MODES:
        runs.append({"name": mode, "log_drafts": True, "engine": {
            **ENGINE, "speculative_algorithm": "LOOKAHEAD", "speculative_num_draft_tokens": 8,
            "speculative_lookahead_isolation": mode}})
    spec = {"model": tiny_model, "text": "Question about this document: what does it return?",
            "lead": 40, "a_tokens": 96, "guess_tokens": 48, "runs": runs}
    return run_driver(spec, tmp_path_factory.mktemp("isolation"), cpu_subprocess_env, driver="isolation_driver.py")


def _streams(scenario, run) -> dict:
    # Every request's whole text: its prompt and its output.
    out = {"A": scenario["prompt"] + run["outputs"]["A"]}
    for name in GUESSERS:
        out[name] = run["guess_prompt"] + run["outputs"][name]
    return out


@pytest.mark.parametrize("mode", MODES)
def test_outputs_identical_to_plain_decoding(scenario, mode):
    plain, spec = scenario["runs"]["plain"]["outputs"], scenario["runs"][mode]["outputs"]
    assert len(plain["A"]) == 96 and all(len(plain[g]) == 48 for g in GUESSERS)
    assert spec == plain
    # The guessers continue A's text: their prompt is A's, and A's first 40 tokens.
    assert scenario["runs"][mode]["guess_prompt"] == scenario["prompt"] + plain["A"][:40]


@pytest.mark.parametrize("mode", MODES)
def test_drafts_come_from_own_text_and_scope_only(scenario, mode):
    run = scenario["runs"][mode]
    streams = _streams(scenario, run)
    logged = {rec["rid"] for rec in run["drafts"]}
    assert logged == {"A", *GUESSERS}
    for rec in run["drafts"]:
        assert rec["scope"] == SCOPES[mode][rec["rid"]] and rec["share"] == (mode != "request"), rec
    for name in GUESSERS:
        drafts = drafts_with_own_streams(run["drafts"], name, run["guess_prompt"])
        assert len(drafts) >= 5, (name, len(drafts))  # 47 tokens after the first, at most 8 a step
        others = [streams[r] for r in MAY_DRAFT_FROM[mode][name]]
        from_others = 0
        for rec, own in drafts:
            draft = (rec["tokens"], rec["parents"])
            # Never a path from text it may not see (for bob and the unsalted
            # request under salt: nothing but their own prompt and output) ...
            assert not unexplained_paths(draft, rec["context"], [own] + others), (mode, name, rec)
            from_others += bool(unexplained_paths(draft, rec["context"], [own]))
        # ... and from the text it may see, when there is some: isolation is
        # by scope, not the end of sharing.
        if others:
            assert from_others > 0, (mode, name)
        assert drafts[-1][1] == streams[name][: len(drafts[-1][1])]


def test_isolation_costs_acceptance_only_where_it_isolates(scenario):
    """Drafting from A's text, the alice guesser accepts more under salt than
    under request, where nothing is shared; both outputs stay the same."""
    def accepted(mode, name):
        records = [r for r in scenario["runs"][mode]["drafts"] if r["rid"] == name]
        return len(scenario["runs"][mode]["outputs"][name]) / max(1, len(records))

    assert accepted("salt", "alice") > accepted("request", "alice")
