"""``--speculative-lookahead-hybrid``: flag, start-up checks and worker choice, without a model."""

from __future__ import annotations

import re

import pytest

from sglang_args import _engine_args, _resolve  # noqa: E402

FLAG = "--speculative-lookahead-hybrid"


def _eagle(model_dir, **kwargs):
    base = dict(speculative_algorithm="EAGLE", speculative_draft_model_path=model_dir,
                speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    return _engine_args(model_dir, **{**base, **kwargs})


def test_hybrid_resolves_on_eagle_and_keeps_the_name(plugin, model_dir, caplog):
    import logging

    from sglang.srt.arg_groups.overrides import resolution_result

    from lookahead.plugin.server_args import get_hybrid_args, hybrid_enabled

    with caplog.at_level(logging.WARNING, logger="lookahead.plugin.server_args"):
        record = _resolve(_eagle(model_dir, speculative_lookahead_hybrid=True,
                                 speculative_lookahead_max_match_len=16, speculative_lookahead_isolation="none"))
    assert hybrid_enabled(record)
    assert resolution_result(record, "speculative_algorithm") == "EAGLE"
    args = get_hybrid_args(record)
    assert (args.max_match_len, args.isolation) == (16, "none")
    # The trie options are used by the hybrid: no "only used with LOOKAHEAD" warning for them.
    assert "only used with" not in caplog.text
    assert not hybrid_enabled(_resolve(_eagle(model_dir)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"speculative_algorithm": "LOOKAHEAD", "speculative_draft_model_path": None}, "got 'LOOKAHEAD'"),
        ({"speculative_algorithm": "NGRAM", "speculative_draft_model_path": None,
          "speculative_eagle_topk": None, "speculative_num_steps": None}, "got 'NGRAM'"),
        ({"speculative_algorithm": None, "speculative_draft_model_path": None, "speculative_eagle_topk": None,
          "speculative_num_steps": None, "speculative_num_draft_tokens": None}, "got None"),
        ({"enable_multi_layer_eagle": True}, "multi-layer EAGLE"),
        ({"speculative_lookahead_max_match_len": 0}, "--speculative-lookahead-max-match-len must be an integer >= 1"),
    ],
)  # fmt: skip
def test_bad_combinations_fail_at_startup(plugin, model_dir, kwargs, message):
    record = _eagle(model_dir, speculative_lookahead_hybrid=True, **kwargs)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        _resolve(record)
    assert FLAG in str(err.value) or "must be an integer" in str(err.value)


def test_rejection_sampling_is_refused(plugin, model_dir):
    record = _eagle(model_dir, speculative_lookahead_hybrid=True, speculative_use_rejection_sampling=True)
    with pytest.raises(ValueError, match=re.escape(FLAG) + ".*rejection sampling"):
        _resolve(record)


def test_cli_flag_parses(plugin, model_dir):
    from sglang.srt.server_args import prepare_server_args

    record = prepare_server_args(["--model-path", model_dir, "--speculative-algorithm", "EAGLE",
                                  "--speculative-draft-model-path", model_dir, FLAG])
    from lookahead.plugin.server_args import hybrid_enabled

    assert hybrid_enabled(record)


def test_worker_class_is_eagles_subclass_only_with_the_flag(plugin, model_dir):
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from lookahead.plugin.hybrid_worker import LookaheadHybridWorker

    eagle = SpeculativeAlgorithm.EAGLE
    assert eagle.create_worker(_resolve(_eagle(model_dir))) is EAGLEWorkerV2
    hybrid = eagle.create_worker(_resolve(_eagle(model_dir, speculative_lookahead_hybrid=True)))
    assert hybrid is LookaheadHybridWorker and issubclass(hybrid, EAGLEWorkerV2)
