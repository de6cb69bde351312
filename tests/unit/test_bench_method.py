"""The benchmarks' method: rounds in rotated order, the held-out prompt set,
decodings named in --configs, and the step count every decoding shares."""

from __future__ import annotations

import json

import pytest

import bench_workloads
import real_workloads
import rounds


def test_each_round_starts_at_the_next_engine():
    names = ["plain", "NGRAM-8", "LOOKAHEAD"]
    assert [rounds.rotated(names, r) for r in range(4)] == [
        names, ["NGRAM-8", "LOOKAHEAD", "plain"], ["LOOKAHEAD", "plain", "NGRAM-8"], names]


def test_run_rounds_serves_in_rotated_order_and_keeps_every_round(tmp_path):
    served, kept = [], []
    out = rounds.run_rounds(["a", "b", "c"], 3, lambda name, r: served.append((r, name)) or {"r": r, "n": name},
                            keep=lambda r, res: kept.append((r, rounds.write_round(tmp_path / "o.json", r, res))),
                            log=lambda m: None)
    assert [n for _, n in served] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [list(res) for res in out] == [["a", "b", "c"]] * 3  # results in the names' order
    assert [json.loads(p.read_text())["a"]["r"] for _, p in kept] == [0, 1, 2]
    assert [p.name for _, p in kept] == ["o.r0.json", "o.r1.json", "o.r2.json"]
    with pytest.raises(ValueError):
        rounds.run_rounds(["a"], 0, lambda n, r: {})


def test_the_median_is_bolded_with_the_range_beside_it():
    s = rounds.spread([1.5, 0.9, 1.2])
    assert (s["median"], s["min"], s["max"]) == (1.2, 0.9, 1.5)
    assert rounds.cell(s) == "**1.20x** [0.90-1.50]"
    assert rounds.cell(rounds.spread([2.0])) == "**2.00x**"


@pytest.mark.parametrize("kind", ["edit", "qa", "chat"])
def test_the_report_set_shares_no_source_with_the_tuning_set(kind):
    tuning = {c[-1]["content"] for c in real_workloads.conversations(kind, 16, 0, "tuning")}
    report = {c[-1]["content"] for c in real_workloads.conversations(kind, 16, 0, "report")}
    assert len(tuning) == len(report) == 16 and not tuning & report
    assert not set(real_workloads.EDIT_MODULES) & set(real_workloads.REPORT_EDIT_MODULES)
    assert not set(real_workloads.CHAT_QUESTIONS) & set(real_workloads.REPORT_CHAT_QUESTIONS)
    assert not set(real_workloads.FOLLOW_UPS) & set(real_workloads.REPORT_FOLLOW_UPS)
    if kind == "qa":  # module docstrings, not the language reference
        assert all(t.startswith("Document:") for t in tuning)
        assert all(t.startswith("Documentation of") for t in report)


def test_the_tuning_set_keeps_the_draws_of_earlier_runs_and_bad_sets_are_refused():
    # Seed 0 of the tuning set is what every run before the split drew.
    assert real_workloads.conversations("chat", 3, 0) == real_workloads.conversations("chat", 3, 0, "tuning")
    with pytest.raises(ValueError, match="unknown prompt set"):
        real_workloads.conversations("chat", 1, 0, "test")


def test_decodings_are_named_with_their_width_and_mode():
    base = {"dtype": "bfloat16"}
    assert bench_workloads.engine_config("plain", base, 8) == base
    assert bench_workloads.engine_config("NGRAM-16", base, 8) == {
        **base, "speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 16}
    fixed = bench_workloads.engine_config("LOOKAHEAD-fixed", base, 8)
    assert fixed["speculative_num_draft_tokens"] == 8 and fixed["speculative_lookahead_fixed_width"] is True
    assert "speculative_lookahead_fixed_width" not in bench_workloads.engine_config("LOOKAHEAD-4", base, 8)
    for bad in ("NGRAM-fixed", "plain-8", "EAGLE"):
        with pytest.raises(ValueError, match="unknown decoding"):
            bench_workloads.engine_config(bad, base, 8)


def test_every_decoding_counts_the_prefill_as_a_step():
    plain = {"output_ids": [1, 2, 3, 4], "meta_info": {}}
    spec = {"output_ids": [1, 2, 3, 4], "meta_info": {"spec_verify_ct": 1}}  # the prefill, then one verify
    assert bench_workloads.steps_of(plain) == 4 and bench_workloads.steps_of(spec) == 2
    assert bench_workloads.steps_of({"output_ids": [7], "meta_info": {"spec_verify_ct": 0}}) == 1


def test_a_resumed_run_keeps_the_rotation_going():
    served = []
    out = rounds.run_rounds(["a", "b", "c"], 1, lambda name, r: served.append((r, name)) or r,
                            log=lambda m: None, first=2)
    assert served == [(2, "c"), (2, "a"), (2, "b")] and out == [{"a": 2, "b": 2, "c": 2}]
