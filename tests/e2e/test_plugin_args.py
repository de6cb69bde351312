"""LOOKAHEAD's registration and server options, without running a model.

Covers: registration (idempotent, complete spec-algorithm interface, lazy
worker import), the CLI (flags parse, bad values rejected, ``--help``), the
``sgl.Engine`` keyword path, start-up validation of bad combinations, the
SGLang-side settings made for LOOKAHEAD, and the transport of the options to a
spawned child (pickling) and to the published ``spec`` bag.

In-process tests call ``lookahead.plugin.register()`` and ``load_plugins()``.
Subprocess tests find the plugin through an ``sglang.srt.plugins`` entry point
declared by a throw-away ``.dist-info`` directory on ``PYTHONPATH`` (the same
discovery path as an installed package), so they need no ``pip install``.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import subprocess
import sys
import textwrap
import types

import pytest

from sglang_args import _EXTRA_PATH, REPO, _engine_args, _resolve  # noqa: E402


def _declared_flags() -> list:
    """The flag of every field ``LookaheadServerArgs`` adds to SGLang's ``ServerArgs``."""
    import msgspec

    from lookahead.plugin.server_args import LookaheadServerArgs, _original_server_args_class

    base = {f.name for f in msgspec.structs.fields(_original_server_args_class())}
    return ["--" + f.name.replace("_", "-") for f in msgspec.structs.fields(LookaheadServerArgs)
            if f.name not in base]


def _resolved(record, name):
    from sglang.srt.arg_groups.overrides import resolution_result

    return resolution_result(record, name)


# --------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------


def test_register_is_idempotent(plugin):
    import sglang.srt.server_args as sgl_server_args
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from lookahead.plugin.server_args import LookaheadServerArgs

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    for _ in range(3):
        plugin.register()
    assert SpeculativeAlgorithm.from_string("lookahead") is algo
    assert isinstance(algo, plugin.LookaheadSpecAlgo)
    assert algo.name == "LOOKAHEAD"
    assert algo.supports_overlap
    hooks = HookRegistry._hooks["sglang.srt.server_args.ServerArgs"]
    assert sum(h is LookaheadServerArgs for _, h, _ in hooks) == 1
    assert sgl_server_args.ServerArgs is LookaheadServerArgs
    with pytest.raises(ValueError, match="already registered"):
        SpeculativeAlgorithm.register("LOOKAHEAD")(lambda server_args: None)


def test_spec_algo_answers_the_whole_enum_interface(plugin, model_dir):
    """Every method SGLang's ``SpeculativeAlgorithm`` members answer (found by
    introspection, so a method added upstream is checked too) is answered by
    LOOKAHEAD as NGRAM answers it, since LOOKAHEAD runs NGRAM's verify flow;
    only ``is_ngram`` (which would give our worker NGRAM's corpus manager),
    ``handle_server_args`` and ``create_worker`` are LOOKAHEAD's own."""
    import inspect

    import torch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    ngram = SpeculativeAlgorithm.NGRAM
    interface = {
        name: inspect.signature(getattr(ngram, name))
        for name, value in vars(SpeculativeAlgorithm).items()
        if not name.startswith("_")
        and callable(getattr(ngram, name, None))
        and not isinstance(value, (classmethod, staticmethod))  # from_string, register
    }
    assert len(interface) > 20, sorted(interface)  # the introspection found the interface
    missing = sorted(n for n in interface if not callable(getattr(algo, n, None)))
    assert not missing, f"LookaheadSpecAlgo lacks {missing}"
    assert algo.name == "LOOKAHEAD"

    # Every question without arguments: NGRAM's answer, except is_ngram.
    questions = {n for n, sig in interface.items() if not sig.parameters}
    assert {"is_ngram", "has_draft_kv", "need_topk", "get_platform_worker_cls"} <= questions
    differ = {n: (getattr(algo, n)(), getattr(ngram, n)()) for n in sorted(questions)
              if getattr(algo, n)() != getattr(ngram, n)()}
    assert differ == {"is_ngram": (False, True)}, differ

    # The methods with arguments, called alike on both.
    own = {"handle_server_args", "create_worker"}  # LOOKAHEAD's own, tested below
    with_args = set(interface) - questions - own
    record = _resolve(_engine_args(model_dir))
    pool = types.SimpleNamespace(req_to_token=torch.zeros(4, 8, dtype=torch.int32))

    def future_map_layout(spec_algo, **kwargs):
        fm = spec_algo.create_future_map(torch.device("cpu"), pool, **kwargs)
        return {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
                for k, v in vars(fm).items() if k != "req_to_token"}

    calls = {
        "get_num_tokens_per_req_for_target_verify": [(n, d) for n in (1, 2, 8) for d in (False, True)],
        "build_disagg_draft_input": [(None, None, None)],
        "resolve_max_speculative_num_draft_tokens": [(record,)],
    }
    assert with_args == set(calls) | {"create_future_map"}, (
        f"SpeculativeAlgorithm methods this test does not call: {sorted(with_args - set(calls))}")
    for name, arg_lists in calls.items():
        for args in arg_lists:
            assert getattr(algo, name)(*args) == getattr(ngram, name)(*args), (name, args)
    # NGRAM's relay buffers (FutureMap keys them on is_ngram()), and always the
    # CPU seq lens the worker sizes the verify mask with, as NGRAM's default.
    for kwargs in ({}, {"needs_cpu_seq_lens": False}, {"needs_confidence_relay": True}):
        assert future_map_layout(algo, **kwargs) == future_map_layout(
            ngram, **{**kwargs, "needs_cpu_seq_lens": True}), kwargs


def test_overlap_is_off_on_cpu_only_and_the_worker_imports_lazily(plugin, model_dir, monkeypatch):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    import lookahead.plugin.arg_rules as la_args

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    # SGLang's rule for its own speculative algorithms: no overlap on CPU.
    resolved = _resolve(_engine_args(model_dir))
    assert _resolved(resolved, "disable_overlap_schedule") is True
    # Lifted (as the overlap tests do), the overlap schedule stays on.
    monkeypatch.setattr(la_args, "disable_overlap_on_cpu", lambda sa: None)
    overlapped = _resolve(_engine_args(model_dir))
    assert _resolved(overlapped, "disable_overlap_schedule") is False
    worker_cls = algo.create_worker(overlapped)
    assert worker_cls.__name__ == "LookaheadWorker"
    assert worker_cls.__module__ == "lookahead.plugin.worker"


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def test_cli_parses_the_options(plugin, model_dir, tmp_path):
    from sglang.srt.server_args import prepare_server_args

    from lookahead.plugin.server_args import LookaheadServerArgs, get_lookahead_args

    args = prepare_server_args(
        [
            "--model-path", model_dir,
            "--speculative-algorithm", "LOOKAHEAD",
            "--speculative-num-draft-tokens", "4",
            "--speculative-one-branch",
            "--speculative-lookahead-max-batch-size", "6",
            "--speculative-lookahead-max-match-len", "16",
            "--speculative-lookahead-memory-mb", "64",
            "--speculative-lookahead-path", str(tmp_path / "trie.npz"),
            "--speculative-lookahead-isolation", "request",
        ]
    )  # fmt: skip
    assert isinstance(args, LookaheadServerArgs)
    assert args.speculative_num_draft_tokens == 4
    assert args.speculative_one_branch is True
    assert args.speculative_lookahead_max_batch_size == 6
    assert args.speculative_lookahead_max_match_len == 16
    assert args.speculative_lookahead_memory_mb == 64
    assert args.speculative_lookahead_path == str(tmp_path / "trie.npz")
    assert args.speculative_lookahead_isolation == "request"
    la = get_lookahead_args(args)
    assert (la.num_draft_tokens, la.draft_budget, la.one_branch, la.isolation) == (4, 3, True, "request")
    assert la.cache_overrides() == {"max_match_len": 16, "max_memory_bytes": 64 << 20}

    defaults = prepare_server_args(["--model-path", model_dir])
    assert defaults.speculative_one_branch is False
    assert defaults.speculative_lookahead_max_batch_size == 4
    assert defaults.speculative_lookahead_max_match_len is None
    assert defaults.speculative_lookahead_memory_mb is None
    assert defaults.speculative_lookahead_path is None
    assert defaults.speculative_lookahead_isolation == "salt"
    assert get_lookahead_args(defaults).isolation == "salt"
    assert get_lookahead_args(defaults).cache_overrides() == {}

    auto = prepare_server_args(["--model-path", model_dir, "--speculative-algorithm", "LOOKAHEAD",
                                "--speculative-lookahead-max-batch-size", "auto"])
    assert auto.speculative_lookahead_max_batch_size == "auto"
    assert get_lookahead_args(auto).adaptive


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--speculative-lookahead-max-batch-size", "-1", "must be an integer >= 0 (0 never speculates) or 'auto', got -1"),
        ("--speculative-lookahead-max-batch-size", "two", "expected an integer"),
        ("--speculative-lookahead-max-batch-size", "automatic", "expected an integer"),
        ("--speculative-lookahead-max-match-len", "0", "must be an integer >= 1, got 0"),
        ("--speculative-lookahead-memory-mb", "0", "must be an integer >= 1, got 0"),
        ("--speculative-lookahead-path", " ", "must be a non-empty file path"),
        ("--speculative-lookahead-isolation", "tenant", "must be one of salt, none, request, got 'tenant'"),
        ("--speculative-lookahead-share", "http://h:6379", "must start with redis://, rediss:// or unix://, got http://h:6379"),
        ("--speculative-lookahead-share", "redis://u:pw@h:6379/x", "needs a database number after the host (redis://host:6379/0), got redis://u:***@h:6379/x"),
        ("--speculative-lookahead-share-maxlen", "0", "must be an integer >= 1 (stream entries kept), got 0"),
    ],
)
def test_cli_rejects_bad_values(plugin, model_dir, capsys, flag, value, message):
    from sglang.srt.server_args import prepare_server_args

    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", model_dir, flag, value])
    err = capsys.readouterr().err
    assert f"argument {flag}: {message}" in err


# --------------------------------------------------------------------------
# Start-up resolution: SGLang-side settings and bad combinations
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "one_branch, num_draft_tokens, topk, num_steps",
    [
        (True, 4, 1, 3),
        (False, 4, 3, 1),
        (False, 2, 1, 1),
        (True, 1, 1, 1),
    ],
)
def test_resolution_sets_sglang_fields(
    plugin, model_dir, one_branch, num_draft_tokens, topk, num_steps
):
    record = _resolve(
        _engine_args(
            model_dir,
            speculative_num_draft_tokens=num_draft_tokens,
            speculative_one_branch=one_branch,
            enable_mixed_chunk=True,
        )
    )
    assert _resolved(record, "speculative_algorithm") == "LOOKAHEAD"
    assert _resolved(record, "disable_overlap_schedule") is True
    assert _resolved(record, "enable_mixed_chunk") is False
    assert _resolved(record, "speculative_num_draft_tokens") == num_draft_tokens
    assert _resolved(record, "speculative_eagle_topk") == topk
    assert _resolved(record, "speculative_num_steps") == num_steps
    # KV reserved per decode step must cover the verify width, no more.
    assert max(num_steps * topk, num_draft_tokens) == num_draft_tokens


def test_resolution_defaults_num_draft_tokens(plugin, model_dir, caplog):
    from lookahead.plugin.server_args import DEFAULT_NUM_DRAFT_TOKENS, get_lookahead_args

    with caplog.at_level(logging.WARNING, logger="lookahead.plugin.arg_rules"):
        record = _resolve(_engine_args(model_dir))
    assert _resolved(record, "speculative_num_draft_tokens") == DEFAULT_NUM_DRAFT_TOKENS
    assert get_lookahead_args(record).num_draft_tokens == DEFAULT_NUM_DRAFT_TOKENS
    assert "set to 8 by default for LOOKAHEAD" in caplog.text


def test_allowed_edge_combinations(plugin, model_dir):
    # A chain has no tree mask: on CUDA, page_size > 1 is fine with any backend.
    record = _resolve(
        _engine_args(model_dir, device="cuda", attention_backend="triton", page_size=16,
                     speculative_one_branch=True)
    )
    assert _resolved(record, "page_size") == 16
    # Never speculating needs no TARGET_VERIFY support.
    _resolve(
        _engine_args(
            model_dir,
            attention_backend="torch_native",
            speculative_lookahead_max_batch_size=0,
        )
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"speculative_num_draft_tokens": 0}, "--speculative-num-draft-tokens must be an integer >= 1"),
        ({"speculative_num_draft_tokens": -2}, "--speculative-num-draft-tokens must be an integer >= 1"),
        ({"speculative_lookahead_max_batch_size": -1}, "--speculative-lookahead-max-batch-size must be an integer >= 0"),
        ({"speculative_lookahead_max_batch_size": "4"}, "--speculative-lookahead-max-batch-size must be an integer >= 0"),
        ({"speculative_lookahead_max_match_len": 0}, "--speculative-lookahead-max-match-len must be an integer >= 1"),
        ({"speculative_lookahead_memory_mb": -5}, "--speculative-lookahead-memory-mb must be an integer >= 1"),
        ({"speculative_lookahead_memory_mb": 1 << 40}, f"--speculative-lookahead-memory-mb {1 << 40} is more than this machine's memory"),
        ({"speculative_one_branch": "yes"}, "--speculative-one-branch must be a bool"),
        ({"speculative_lookahead_fixed_width": "yes"}, "--speculative-lookahead-fixed-width must be a bool"),
        ({"speculative_lookahead_path": ""}, "--speculative-lookahead-path must be a non-empty file path"),
        ({"speculative_lookahead_isolation": "tenant"}, "--speculative-lookahead-isolation must be one of salt, none, request, got 'tenant'"),
        ({"speculative_lookahead_share": "redis:/h"}, "--speculative-lookahead-share needs a host (redis://host:6379/0), got redis:/h"),
        ({"speculative_lookahead_share_maxlen": 0}, "--speculative-lookahead-share-maxlen must be an integer >= 1"),
        ({"page_size": 16}, "only supported by the 'flashinfer' attention backend"),
        ({"page_size": 16, "speculative_one_branch": True}, "LOOKAHEAD on CPU needs --page-size 1 (got 16)"),
        ({"attention_backend": "torch_native"}, "torch_native attention backend does not support"),
        ({"speculative_draft_model_path": "MODEL_DIR"}, "uses no draft model"),
    ],
)  # fmt: skip
def test_bad_combinations_fail_at_startup(plugin, model_dir, kwargs, message):
    # sglang reads a draft model's config before LOOKAHEAD's handler runs.
    kwargs = {k: model_dir if v == "MODEL_DIR" else v for k, v in kwargs.items()}
    record = _engine_args(model_dir, **kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        _resolve(record)


def test_path_is_checked_and_made_absolute(plugin, model_dir, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="not a regular file"):
        _resolve(_engine_args(model_dir, speculative_lookahead_path=str(tmp_path)))
    with pytest.raises(ValueError, match="does not exist"):
        _resolve(
            _engine_args(
                model_dir, speculative_lookahead_path=str(tmp_path / "no" / "t.npz")
            )
        )
    monkeypatch.chdir(tmp_path)
    record = _resolve(_engine_args(model_dir, speculative_lookahead_path="trie.npz"))
    assert _resolved(record, "speculative_lookahead_path") == str(tmp_path / "trie.npz")


def test_options_for_another_algorithm_are_reported(plugin, caplog):
    from sglang.srt.server_args import ServerArgs

    with caplog.at_level(logging.WARNING, logger="lookahead.plugin.server_args"):
        ServerArgs(model_path="dummy").resolve_once()
    assert "only used with --speculative-algorithm LOOKAHEAD" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="lookahead.plugin.server_args"):
        ServerArgs(
            model_path="dummy",
            speculative_one_branch=True,
            speculative_lookahead_max_batch_size=2,
        ).resolve_once()
    assert (
        "--speculative-one-branch, --speculative-lookahead-max-batch-size: only "
        "used with --speculative-algorithm LOOKAHEAD" in caplog.text
    )


# --------------------------------------------------------------------------
# Accessor and transport
# --------------------------------------------------------------------------


def test_accessor_follows_record_pickle_and_published_bag(plugin, model_dir, tmp_path):
    from sglang.srt.runtime_context import publish, restore_context, snapshot_context

    from lookahead.plugin.server_args import LookaheadArgs, get_lookahead_args

    record = _resolve(
        _engine_args(
            model_dir,
            speculative_num_draft_tokens=6,
            speculative_lookahead_max_batch_size=3,
            speculative_lookahead_memory_mb=32,
            speculative_lookahead_path=str(tmp_path / "t.npz"),
            speculative_lookahead_isolation="none",
        )
    )
    expected = LookaheadArgs(
        num_draft_tokens=6,
        one_branch=False,
        max_batch_size=3,
        max_match_len=None,
        memory_mb=32,
        path=str(tmp_path / "t.npz"),
        isolation="none",
    )
    assert get_lookahead_args(record) == expected
    assert get_lookahead_args(pickle.loads(pickle.dumps(record))) == expected

    from lookahead.plugin.request_feed import RequestFeed

    saved = snapshot_context()
    try:
        publish(record, role="scheduler")
        assert get_lookahead_args() == expected  # from get_spec()
        # A worker that does not pass the isolation mode gets the server's.
        assert RequestFeed(None).isolation == "none"
        assert RequestFeed(None, isolation="request").isolation == "request"
    finally:
        restore_context(saved)
    with pytest.raises(ValueError, match="isolation must be one of salt, none, request, got 'tenant'"):
        RequestFeed(None, isolation="tenant")

    assert expected.draft_budget == 5
    assert expected.speculation_bound == 3 and not expected.adaptive
    auto = LookaheadArgs(max_batch_size="Auto")
    assert auto.adaptive and auto.max_batch_size == "auto" and auto.speculation_bound == 32
    with pytest.raises(ValueError, match="integer >= 0 .* or 'auto'"):
        LookaheadArgs(max_batch_size="sometimes")


def test_documented_defaults_match_the_cache(plugin):
    import argparse

    from lookahead.trie.cache import LookaheadConfig

    from lookahead.plugin.server_args import LookaheadServerArgs

    parser = argparse.ArgumentParser()
    LookaheadServerArgs.add_cli_args(parser)
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    config = LookaheadConfig()
    match_help = helps["--speculative-lookahead-max-match-len"]
    memory_help = helps["--speculative-lookahead-memory-mb"]
    assert f"max_match_len, {config.max_match_len})" in match_help
    assert f"max_memory_bytes, {config.max_memory_bytes >> 20} MiB)" in memory_help


# --------------------------------------------------------------------------
# Fresh processes: entry-point discovery, --help, launch_server, sgl.Engine,
# and a spawned child reading a pickled record before loading any plugin.
# --------------------------------------------------------------------------

_CHILD_SCRIPT = textwrap.dedent(
    r"""
    import pickle, sys
    record_file, model_dir, missing = sys.argv[1:4]

    # 1. A spawned scheduler unpickles its ServerArgs before load_plugins().
    with open(record_file, "rb") as f:
        record = pickle.load(f)
    from lookahead.plugin.server_args import get_lookahead_args
    print("CHILD_ARGS", get_lookahead_args(record))

    # 2. Loading the plugin is cheap: no worker, trie or engine import.
    before = set(sys.modules)
    from sglang.srt.plugins import load_plugins
    load_plugins()
    new = set(sys.modules) - before
    heavy = sorted(m for m in new if m.startswith((
        "lookahead.plugin.worker", "lookahead._", "lookahead.trie.cache",  # "lookahead._": the native trie
        "sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler",
        "sglang.srt.model_executor")))
    print("PLUGIN_LOADED", "lookahead.plugin" in sys.modules, "HEAVY", heavy)

    # 3. The first sgl.Engine(...) call loads the plugins inside __init__ and
    #    must still accept LOOKAHEAD's keywords; validation fails before any
    #    process is spawned.
    import sglang as sgl
    try:
        sgl.Engine(
            model_path=model_dir, device="cpu", attention_backend="intel_amx",
            speculative_algorithm="LOOKAHEAD", speculative_num_draft_tokens=4,
            speculative_one_branch=True, speculative_lookahead_max_batch_size=4,
            speculative_lookahead_path=missing,
        )
    except ValueError as exc:
        print("ENGINE_ERROR", exc)
    from sglang.srt.entrypoints.engine import Engine
    print("ENGINE_CLASS", Engine.server_args_class.__module__, Engine.server_args_class.__name__)
    """
)


@pytest.fixture(scope="module")
def fresh_processes(plugin, model_dir, tmp_path_factory):
    """Run the three fresh-interpreter checks concurrently; return their outputs."""
    tmp = tmp_path_factory.mktemp("fresh")
    dist = tmp / "site" / "lookahead_entrypoint_test-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: lookahead-entrypoint-test\nVersion: 0.0.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nlookahead = lookahead.plugin:register\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [*_EXTRA_PATH, str(REPO), str(dist.parent)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.update(HF_HUB_OFFLINE="1", SGLANG_USE_CPU_ENGINE="1", PYTHONWARNINGS="ignore")
    env.pop("SGLANG_PLUGINS", None)

    record = _resolve(
        _engine_args(
            model_dir,
            speculative_num_draft_tokens=5,
            speculative_one_branch=True,
            speculative_lookahead_max_batch_size=2,
            speculative_lookahead_max_match_len=12,
        )
    )
    record_file = tmp / "record.pkl"
    record_file.write_bytes(pickle.dumps(record))
    missing = str(tmp / "missing-dir" / "trie.npz")

    commands = {
        "help": [sys.executable, "-m", "sglang.launch_server", "--help"],
        "launch": [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", model_dir, "--device", "cpu",
            "--speculative-algorithm", "LOOKAHEAD",
            "--speculative-num-draft-tokens", "4", "--speculative-one-branch",
            "--speculative-lookahead-path", missing,
        ],
        "child": [sys.executable, "-c", _CHILD_SCRIPT, str(record_file), model_dir, missing],
    }  # fmt: skip
    procs = {
        name: subprocess.Popen(
            cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for name, cmd in commands.items()
    }
    results = {}
    for name, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        results[name] = (proc.returncode, out)
    return results


def test_help_lists_the_options(fresh_processes):
    rc, out = fresh_processes["help"]
    assert rc == 0, out[-3000:]
    flags = _declared_flags()
    assert "--speculative-lookahead-corpus" in flags and "--speculative-lookahead-hybrid" in flags
    for flag in flags:
        assert flag in out, flag
    assert "LOOKAHEAD only." in out
    assert "--speculative-num-draft-tokens" in out


def test_launch_server_parses_and_validates(fresh_processes):
    rc, out = fresh_processes["launch"]
    assert rc != 0
    assert "unrecognized arguments" not in out
    assert "--speculative-lookahead-path: directory" in out, out[-3000:]


def test_spawned_child_and_engine_keywords(fresh_processes):
    rc, out = fresh_processes["child"]
    assert rc == 0, out[-3000:]
    assert (
        "CHILD_ARGS LookaheadArgs(num_draft_tokens=5, one_branch=True, "
        "max_batch_size=2, max_match_len=12, memory_mb=None, path=None, isolation='salt', "
        "corpus=(), corpus_memory_mb=None, share=None, share_maxlen=10000, fixed_width=False)"
    ) in out
    assert "PLUGIN_LOADED True HEAVY []" in out, out[-3000:]
    assert "ENGINE_ERROR --speculative-lookahead-path: directory" in out, out[-3000:]
    assert "ENGINE_CLASS lookahead.plugin.server_args LookaheadServerArgs" in out


def test_other_sglang_versions_are_refused():
    from lookahead import SUPPORTED_SGLANG_VERSION, check_sglang_version

    check_sglang_version(SUPPORTED_SGLANG_VERSION)  # the pinned release passes
    check_sglang_version()  # and it is the one installed here
    with pytest.raises(RuntimeError, match=r"supports sglang==0\.5\.23 only, but sglang 0\.5\.24"):
        check_sglang_version("0.5.24")


def test_share_url_password_stays_out_of_logged_and_served_args(plugin, model_dir):
    from sglang.srt.server_args import prepare_server_args

    from lookahead.plugin.server_args import get_lookahead_args

    url = "redis://fleet:hunter2-secret@10.0.0.5:6379/3"
    args = prepare_server_args(["--model-path", model_dir, "--speculative-algorithm", "LOOKAHEAD",
                                "--speculative-lookahead-share", url, "--speculative-lookahead-share-maxlen", "500"])
    la = get_lookahead_args(args)
    assert (la.share, la.share_maxlen) == (url, 500)  # the worker gets the real URL
    masked = "redis://fleet:***@10.0.0.5:6379/3"
    for shown in (repr(args), json.dumps(args.resolved_dict(), default=str), str(args.launch_command)):
        assert "hunter2-secret" not in shown
    assert masked in repr(args) and args.resolved_dict()["speculative_lookahead_share"] == masked
