"""LOOKAHEAD's server options: definitions, transport, checks and accessor.

The options' SGLang-side rules at start-up (NGRAM's, which LOOKAHEAD
shares) are in ``lookahead.plugin.arg_rules``.

How the options reach SGLang
----------------------------
SGLang 0.5.23 has no API for plugin-specific flags. ``ServerArgs`` is a msgspec
struct assembled at import time, consumed by the CLI (``prepare_server_args``
builds its parser from the module-level class's fields), by
``sgl.Engine(**kwargs)`` (an unknown keyword is an error) and by the spawned
scheduler processes (which receive the record pickled, the class by reference).

``LookaheadServerArgs`` below is a ``ServerArgs`` subclass that adds the options
as real fields, declared with SGLang's own ``A[T, Arg(...)]`` metadata and the
``spec`` namespace. ``install()`` puts it in place of ``ServerArgs``, so the CLI
derives ``--speculative-one-branch`` etc. with their help text, ``Engine`` takes
them as ordinary keywords, the record pickles as this class (the values travel
to every child process), and the values are published in the scheduler's
``spec`` bag, ``/server_info`` and the ``server_args=...`` log line.

The replacement is one ``HookRegistry`` class-REPLACE hook (SGLang's documented
way to substitute a subclass; it also rebinds modules that imported the name),
plus the same REPLACE on ``Engine.server_args_class`` when the engine module is
already imported, which is the case when ``Engine.__init__`` itself loads the
plugins. Every hook is registered in ``install()`` with a comment.

Validation happens at start-up, during ``ServerArgs.resolve_once()`` in the
launching process (before anything is spawned), through the
``validate_server_args`` / ``handle_server_args`` callbacks of the registered
spec algorithm (``lookahead.plugin.arg_rules``). Errors are ``ValueError`` with the
offending flag named. Each option's range is checked by one function, which
the CLI parsers and ``LookaheadArgs`` both call: ``lookahead.trie.config``'s for
the options the cache shares (match length, memory, isolation),
``check_max_batch_size`` and ``check_path`` here for the others.

``get_lookahead_args(server_args)`` returns the resolved options as a frozen
``LookaheadArgs`` for the worker.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any, List, Optional, Union

import sglang.srt.server_args as _sgl_server_args
from sglang.srt.arg_groups.arg_utils import A, Arg

from lookahead.trie.config import (DEFAULT_ISOLATION, LookaheadConfig, check_int, check_isolation, check_memory,
                                   option_error)
from lookahead.plugin import share as _share

logger = logging.getLogger(__name__)

ALGORITHM_NAME = "LOOKAHEAD"

# Verify width per request when --speculative-num-draft-tokens is not given:
# the last accepted token (the tree root) plus 7 draft tokens.
DEFAULT_NUM_DRAFT_TOKENS = 8
DEFAULT_MAX_BATCH_SIZE = 4
# --speculative-lookahead-max-batch-size auto: speculation is measured per step
# at batch sizes up to this bound (the batch sizes its verify graphs cover).
AUTO = "auto"
AUTO_MAX_BATCH_SIZE = 32

# Devices whose TARGET_VERIFY path LOOKAHEAD shares with NGRAM (same list as
# sglang's _handle_ngram).
_SUPPORTED_DEVICES = ("cuda", "cpu", "xpu")


# --------------------------------------------------------------------------
# Option checks (each option's one check; LookaheadArgs and the CLI call them)
# --------------------------------------------------------------------------


def check_max_batch_size(value: Any, name: str = "") -> Union[int, str]:
    """``AUTO`` (any case) or an integer >= 0."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise option_error(name, f"must be an integer >= 0 (0 never speculates) or '{AUTO}', got {value!r}")
    return value


def check_path(value: Any, name: str = "") -> Any:
    """A non-empty path (whether it can be used is ``_check_path``'s, at start-up)."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
        raise option_error(name, f"must be a non-empty file path, got {value!r}")
    return value


def _cli(check, integer: bool = True, accepts: str = ""):
    """An argparse type that runs ``check`` on the value (an integer, unless
    ``integer`` is False; ``accepts``: text taken as it is, e.g. ``auto``);
    argparse prints "argument --flag: <message>"."""

    def parse(text: str):
        value = text
        if integer and not (accepts and text.strip().lower() == accepts):
            try:
                value = int(text)
            except ValueError:
                also = f" or '{accepts}'" if accepts else ""
                raise argparse.ArgumentTypeError(f"expected an integer{also}, got {text!r}")
        try:
            return check(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc))

    return parse


# The flags' parsers (module-level names: SGLang evaluates the field
# annotations that name them as strings).
_max_batch_size_arg = _cli(check_max_batch_size, accepts=AUTO)
_match_len_arg = _cli(lambda value: check_int(value, 1))
_memory_mb_arg = _cli(lambda value: check_memory(value, unit="MiB"))
_path_arg = _cli(check_path, integer=False)
_isolation_arg = _cli(lambda value: check_isolation(value, ""), integer=False)


# --------------------------------------------------------------------------
# Option definitions (the one place: name, type, default, help)
# --------------------------------------------------------------------------


def _original_server_args_class() -> type:
    """sglang's own ``ServerArgs``, even if it has already been replaced."""
    cls = _sgl_server_args.ServerArgs
    while cls.__dict__.get("_LOOKAHEAD_SUBCLASS", False):
        cls = cls.__bases__[0]
    return cls


class LookaheadServerArgs(_original_server_args_class()):
    """``ServerArgs`` plus LOOKAHEAD's options, in the ``spec`` namespace.

    ``--speculative-num-draft-tokens`` (SGLang's own field) is reused with
    NGRAM's meaning: the verify width per request, *including* the root (the
    last accepted token), so a tree has ``num_draft_tokens - 1`` draft tokens
    and the same number costs the same verify work under both algorithms.
    """

    # Namespace of the fields declared in this class: the scheduler reads them
    # from get_spec(), next to speculative_num_draft_tokens.
    _NS_PATH = "spec"
    # Marks the subclass (see _original_server_args_class).
    _LOOKAHEAD_SUBCLASS = True

    speculative_one_branch: A[
        bool,
        Arg(
            help="LOOKAHEAD only. Draft a single chain (the best branch) "
            "instead of a tree of --speculative-num-draft-tokens nodes (root "
            "included). Unlike a tree, a chain may be combined with "
            "--page-size > 1 on any attention backend (on CUDA; on CPU "
            "speculative decoding needs --page-size 1).",
        ),
    ] = False
    speculative_lookahead_max_batch_size: A[
        Union[int, str],
        Arg(
            help="LOOKAHEAD only. Speculate only while the running decode "
            "batch has at most this many requests; larger batches decode one "
            "token per step (verification costs more than it saves when the "
            "batch already keeps the hardware busy). 0 never speculates. "
            f"'auto': decide step by step from the measured cost of a step and "
            f"the drafts' expected acceptance, at batch sizes up to {AUTO_MAX_BATCH_SIZE}.",
            type_parser=_max_batch_size_arg,
        ),
    ] = DEFAULT_MAX_BATCH_SIZE
    speculative_lookahead_max_match_len: A[
        Optional[int],
        Arg(
            help="LOOKAHEAD only. Longest context suffix, in tokens, compared "
            "against the trie when drafting (its useful depth; continuations "
            "themselves are not depth-capped). Longer matches are more "
            "specific but cost more host time per step. Unset: the cache's "
            f"default (LookaheadConfig.max_match_len, {LookaheadConfig.max_match_len}).",
            type_parser=_match_len_arg,
        ),
    ] = None
    speculative_lookahead_memory_mb: A[
        Optional[int],
        Arg(
            help="LOOKAHEAD only. Memory budget, in MiB, of the trie's shared "
            "histories, all scopes together (token streams plus index); beyond "
            "it the least recently used scope's oldest tokens are evicted. "
            "Per-request stores of live requests come on top. Unset: the cache's default "
            f"(LookaheadConfig.max_memory_bytes, {LookaheadConfig.max_memory_bytes >> 20} MiB).",
            type_parser=_memory_mb_arg,
        ),
    ] = None
    speculative_lookahead_path: A[
        Optional[str],
        Arg(
            help="LOOKAHEAD only. File (.npz) holding the trie's shared "
            "histories (every scope): loaded at start-up if it exists (so a restarted server "
            "keeps its drafts), written whenever the server drains (rate-"
            "limited) and at exit. Its directory must exist and be writable.",
            type_parser=_path_arg,
        ),
    ] = None
    speculative_lookahead_corpus: A[
        Optional[List[str]],
        Arg(
            help="LOOKAHEAD only. External corpus to draft from, loaded at start-up in the "
            "background (drafts use what is indexed so far); repeatable. PATH is a JSONL file "
            "of strings (SGLang's NGRAM corpus format), a .jsonl of {\"text\": ...} or "
            "{\"input_ids\": [...]} lines, a directory (every text file under it), or a text "
            "file. Its corpus id is PATH as given; it is public (every scope drafts from it).",
            action="extend",
            action_kwargs={"type": str, "nargs": "+"},
        ),
    ] = None
    speculative_lookahead_corpus_memory_mb: A[
        Optional[int],
        Arg(
            help="LOOKAHEAD only. Memory budget, in MiB, of the external corpora "
            "(tokens plus index), apart from the shared histories'; a corpus beyond "
            "it is refused whole. Corpora are never evicted. Unset: the cache's default "
            f"(LookaheadConfig.corpus_memory_bytes, {LookaheadConfig.corpus_memory_bytes >> 20} MiB).",
            type_parser=_memory_mb_arg,
        ),
    ] = None
    speculative_lookahead_fixed_width: A[
        bool,
        Arg(
            help="LOOKAHEAD only. Verify every speculating step at the full "
            "--speculative-num-draft-tokens width, padding shorter drafts, and "
            "apply no verify-cost floor to the drafts: what a GPU does with a "
            "captured graph per width. By default on CPU, where a step's cost "
            "grows with every verified token, a batch verifies at the width of "
            "its longest draft and drafted nodes must be worth their measured "
            "cost. For measuring acceptance per step as a GPU would see it.",
        ),
    ] = False
    speculative_lookahead_hybrid: A[
        bool,
        Arg(
            help="With --speculative-algorithm EAGLE or EAGLE3: also draft from "
            "LOOKAHEAD's trie, and verify per request and step the trie's tree "
            "where the text repeats, EAGLE's elsewhere, or a merge of both, "
            "chosen from measured acceptance; EAGLE's draft model steps are "
            "skipped when every request of the batch has a strong trie draft. "
            "The trie options --speculative-lookahead-max-match-len, "
            "--speculative-lookahead-memory-mb and "
            "--speculative-lookahead-isolation apply.",
        ),
    ] = False
    speculative_lookahead_isolation: A[
        str,
        Arg(
            help="LOOKAHEAD only. Whose text a request's drafts may come "
            "from; accepted drafts make a request decode faster, which "
            "another user can time. salt (default): only requests with the "
            "same cache_salt, else the same extra_key (the keys that isolate "
            "SGLang's prefix cache), else the requests with neither; none: "
            "all requests share one history; request: none, each request "
            "drafts from its own prompt and output only.",
            type_parser=_isolation_arg,
        ),
    ] = DEFAULT_ISOLATION
    speculative_lookahead_share: A[Optional[str], Arg(
        help="LOOKAHEAD only. Share the trie's history with every replica started with the same URL and "
        "--served-model-name (servers behind a router, --dp-size ranks) through a Redis Stream at this URL "
        "(redis://[user:password@]host:port/db): each publishes the text of the requests it finishes, with "
        "their isolation scope, and inserts the others' in the background; drafting never waits on it. "
        "Needs pip install 'sglang-lookahead[share]'.", type_parser=_cli(_share.check_url, integer=False))] = None
    speculative_lookahead_share_maxlen: A[int, Arg(help="LOOKAHEAD only. With --speculative-lookahead-share: the "
        "stream keeps about this many finished requests (XADD MAXLEN ~); a new replica reads them at start.",
        type_parser=_cli(_share.check_maxlen))] = _share.DEFAULT_MAXLEN

    def resolved_dict(self) -> dict:  # the share URL's password: out of logs, /server_info, the launch command
        return _share.mask_in(super().resolved_dict(), self.speculative_lookahead_share)

    def __repr__(self) -> str:
        return _share.mask_in(super().__repr__(), self.speculative_lookahead_share)

    @property
    def launch_command(self):
        return _share.mask_in(super().launch_command, self.speculative_lookahead_share)

    def resolve_once(self) -> None:
        """Resolve as ``ServerArgs`` does, then warn about LOOKAHEAD options
        given for another algorithm (they have no effect)."""
        first = not getattr(self, "_resolution_finished", False)
        super().resolve_once()
        if first:
            check_hybrid_server_args(self)
            _warn_unused_options(self)


# Field name -> LookaheadArgs attribute.
_FIELD_TO_ATTR = {
    "speculative_one_branch": "one_branch",
    "speculative_lookahead_max_batch_size": "max_batch_size",
    "speculative_lookahead_max_match_len": "max_match_len",
    "speculative_lookahead_memory_mb": "memory_mb",
    "speculative_lookahead_path": "path",
    "speculative_lookahead_isolation": "isolation",
    "speculative_lookahead_corpus": "corpus",
    "speculative_lookahead_corpus_memory_mb": "corpus_memory_mb",
    "speculative_lookahead_share": "share",
    "speculative_lookahead_share_maxlen": "share_maxlen",
    "speculative_lookahead_fixed_width": "fixed_width",
}
# Options the hybrid (EAGLE + --speculative-lookahead-hybrid) uses as well: they
# configure the trie.
HYBRID_FIELDS = ("speculative_lookahead_max_match_len", "speculative_lookahead_memory_mb",
                 "speculative_lookahead_isolation")
HYBRID_FIELD = "speculative_lookahead_hybrid"
HYBRID_ALGORITHMS = ("EAGLE", "EAGLE3")
LOOKAHEAD_FIELDS = tuple(_FIELD_TO_ATTR)


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _declared_defaults() -> dict[str, Any]:
    import msgspec

    return {
        f.name: f.default
        for f in msgspec.structs.fields(LookaheadServerArgs)
        if f.name in _FIELD_TO_ATTR
    }


# --------------------------------------------------------------------------
# Accessor
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LookaheadArgs:
    """LOOKAHEAD's resolved options, as the worker uses them.

    ``num_draft_tokens`` is the verify width per request including the root
    (NGRAM's meaning), hence ``draft_budget = num_draft_tokens - 1`` draft
    tokens per request and step.
    """

    num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS
    one_branch: bool = False
    max_batch_size: Union[int, str] = DEFAULT_MAX_BATCH_SIZE  # or AUTO
    max_match_len: Optional[int] = None
    memory_mb: Optional[int] = None
    path: Optional[str] = None
    isolation: str = DEFAULT_ISOLATION
    corpus: tuple = ()  # --speculative-lookahead-corpus paths
    corpus_memory_mb: Optional[int] = None
    share: Optional[str] = None  # --speculative-lookahead-share URL
    share_maxlen: int = _share.DEFAULT_MAXLEN
    fixed_width: bool = False  # verify at num_draft_tokens every speculating step, no cost floor

    def __post_init__(self):
        def is_int(value):
            return isinstance(value, int) and not isinstance(value, bool)

        if not is_int(self.num_draft_tokens) or self.num_draft_tokens < 1:
            raise ValueError(
                "--speculative-num-draft-tokens must be an integer >= 1 for "
                "LOOKAHEAD (it is the verify width per request, including the "
                f"last accepted token), got {self.num_draft_tokens!r}"
            )
        for flag, value in (("--speculative-one-branch", self.one_branch),
                            ("--speculative-lookahead-fixed-width", self.fixed_width)):
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be a bool, got {value!r}")
        object.__setattr__(self, "max_batch_size",
                           check_max_batch_size(self.max_batch_size, "--speculative-lookahead-max-batch-size"))
        if self.max_match_len is not None:
            check_int(self.max_match_len, 1, "--speculative-lookahead-max-match-len")
        if self.memory_mb is not None:
            check_memory(self.memory_mb, "--speculative-lookahead-memory-mb", unit="MiB")
        if self.path is not None:
            check_path(self.path, "--speculative-lookahead-path")
        check_isolation(self.isolation, "--speculative-lookahead-isolation")
        corpus = self.corpus or ()
        if isinstance(corpus, (str, os.PathLike)):
            corpus = (corpus,)
        for path in corpus:
            check_path(path, "--speculative-lookahead-corpus")
        object.__setattr__(self, "corpus", tuple(os.fspath(p) for p in corpus))
        if self.corpus_memory_mb is not None:
            check_memory(self.corpus_memory_mb, "--speculative-lookahead-corpus-memory-mb", unit="MiB")
        _share.check_options(self.share, self.share_maxlen)

    @property
    def draft_budget(self) -> int:
        """Draft tokens per request and step (the tree root excluded)."""
        return self.num_draft_tokens - 1

    @property
    def adaptive(self) -> bool:
        """Whether speculation is decided per step (``auto``)."""
        return self.max_batch_size == AUTO

    @property
    def speculation_bound(self) -> int:
        """The largest batch size that may speculate."""
        return AUTO_MAX_BATCH_SIZE if self.adaptive else self.max_batch_size

    def cache_overrides(self) -> dict[str, Any]:
        """Keyword overrides for ``lookahead.LookaheadConfig`` (only the options
        that were set; the rest keep the cache's tuned defaults)."""
        out: dict[str, Any] = {}
        if self.max_match_len is not None:
            out["max_match_len"] = self.max_match_len
        if self.memory_mb is not None:
            out["max_memory_bytes"] = self.memory_mb << 20
        if self.corpus_memory_mb is not None:
            out["corpus_memory_bytes"] = self.corpus_memory_mb << 20
        return out


def _read(server_args: Any, name: str, default: Any) -> Any:
    """The resolved value of ``name``: the last resolution declaration, then the
    raw field, then ``default`` (records without the field, e.g. a plain
    ``ServerArgs`` built before the plugin was loaded)."""
    from sglang.srt.arg_groups.arg_utils import is_record

    if is_record(server_args):
        from sglang.srt.arg_groups.overrides import resolution_result

        value = resolution_result(server_args, name, default)
    else:  # a resolving view / stand-in during resolution, or the spec bag
        value = getattr(server_args, name, default)
    return default if value is None and default is not None else value


def get_lookahead_args(server_args: Any = None) -> LookaheadArgs:
    """LOOKAHEAD's options from ``server_args`` (a record, a resolution view, or
    SGLang's published ``spec`` bag). Without an argument, reads the bag
    published in this process (``runtime_context.get_spec()``), which follows
    runtime overrides.

    Raises ``ValueError`` when a value is out of range.
    """
    if server_args is None:
        from sglang.srt.runtime_context import get_spec

        server_args = get_spec()
    defaults = _declared_defaults()
    values = {
        attr: _read(server_args, field, defaults[field])
        for field, attr in _FIELD_TO_ATTR.items()
    }
    values["num_draft_tokens"] = _read(
        server_args, "speculative_num_draft_tokens", DEFAULT_NUM_DRAFT_TOKENS
    )
    return LookaheadArgs(**values)


def _warn_unused_options(server_args: Any) -> None:
    """Options given while --speculative-algorithm is not LOOKAHEAD do nothing
    (except the trie's, with --speculative-lookahead-hybrid)."""
    from sglang.srt.arg_groups.overrides import resolution_result

    algorithm = resolution_result(server_args, "speculative_algorithm")
    if algorithm is not None and str(algorithm).upper() == ALGORITHM_NAME:
        return
    hybrid = hybrid_enabled(server_args)
    defaults = _declared_defaults()
    unused = [
        _flag(field)
        for field in _FIELD_TO_ATTR
        if getattr(server_args, field, defaults[field]) != defaults[field]
        and not (hybrid and field in HYBRID_FIELDS)
    ]
    if unused:
        logger.warning(
            "%s: only used with --speculative-algorithm %s (got %s); ignored.",
            ", ".join(unused),
            ALGORITHM_NAME,
            algorithm,
        )


# --------------------------------------------------------------------------
# LOOKAHEAD + EAGLE (--speculative-lookahead-hybrid)
# --------------------------------------------------------------------------


def hybrid_enabled(server_args: Any) -> bool:
    """Whether ``--speculative-lookahead-hybrid`` is set (False for records
    without the field)."""
    return bool(_read(server_args, HYBRID_FIELD, False))


@dataclasses.dataclass(frozen=True)
class HybridArgs:
    """The hybrid's trie options, as ``lookahead.plugin.hybrid_worker`` uses them."""

    max_match_len: Optional[int] = None
    memory_mb: Optional[int] = None
    isolation: str = DEFAULT_ISOLATION

    def cache_overrides(self) -> dict[str, Any]:
        return LookaheadArgs(max_match_len=self.max_match_len, memory_mb=self.memory_mb).cache_overrides()


def get_hybrid_args(server_args: Any = None) -> HybridArgs:
    """The hybrid's options (see ``get_lookahead_args`` for ``server_args``);
    raises ``ValueError`` when a value is out of range."""
    args = get_lookahead_args(server_args)
    return HybridArgs(max_match_len=args.max_match_len, memory_mb=args.memory_mb, isolation=args.isolation)


def check_hybrid_server_args(server_args: Any) -> None:
    """Start-up checks of ``--speculative-lookahead-hybrid`` on the resolved
    record; raises ``ValueError`` naming the flag."""
    if not hybrid_enabled(server_args):
        return
    from sglang.srt.arg_groups.overrides import resolution_result

    flag = _flag(HYBRID_FIELD)

    def value(name):
        return resolution_result(server_args, name, getattr(server_args, name, None))

    algorithm = value("speculative_algorithm")
    if algorithm is None or str(algorithm).upper() not in HYBRID_ALGORITHMS:
        raise ValueError(
            f"{flag} adds LOOKAHEAD's trie drafts to EAGLE: it needs --speculative-algorithm "
            f"{' or '.join(HYBRID_ALGORITHMS)} (with its --speculative-draft-model-path), got "
            f"{algorithm!r}"
            + (" (LOOKAHEAD alone needs no draft model: drop the flag)" if str(algorithm).upper() == ALGORITHM_NAME
               else "")
        )
    for name, why in (
        ("enable_multi_layer_eagle", "the multi-layer EAGLE worker"),
        ("speculative_use_rejection_sampling", "rejection sampling (it needs EAGLE's draft probabilities "
                                              "for every verified token, which trie tokens have none of)"),
        ("enable_dp_attention", "DP attention"),
    ):
        if value(name):
            raise ValueError(f"{flag} does not support {why}: remove --{name.replace('_', '-')} or {flag}")
    if (value("pp_size") or 1) > 1:
        raise ValueError(f"{flag} does not support pipeline parallelism (--pp-size > 1)")
    get_hybrid_args(server_args)  # the trie options' own checks


# --------------------------------------------------------------------------
# Installation (called from lookahead.plugin.register)
# --------------------------------------------------------------------------

_installed = False


def install() -> None:
    """Register the hooks that make ``LookaheadServerArgs`` SGLang's ``ServerArgs``.

    Idempotent. The hooks take effect when ``HookRegistry.apply_hooks()`` runs,
    which ``load_plugins()`` does right after calling every plugin.
    """
    global _installed
    if _installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    # Overrides: the class sglang.srt.server_args.ServerArgs (and, through the
    # registry's propagation, every module that did `from ... import ServerArgs`).
    # Why: prepare_server_args builds the CLI parser from, and instantiates,
    # that module-level class; the subclass adds LOOKAHEAD's fields there, so
    # the flags parse, show in --help and travel pickled to the schedulers.
    # retire when: plugin-declared server args (a plugin registers its fields
    # and SGLang adds them to the CLI, Engine's keywords and the pickled record).
    HookRegistry.register(
        "sglang.srt.server_args.ServerArgs", LookaheadServerArgs, HookType.REPLACE
    )

    # Overrides: Engine.server_args_class, the class Engine.__init__ builds from
    # its keyword arguments (SGLang's designated override point).
    # Why: a class attribute keeps the class it was bound to when the engine
    # module was imported. That is before the plugin loads when the first
    # Engine(...) call loads it, and the propagation above rebinds module
    # globals only. Registered only if the module is loaded already, so that
    # processes that never build an Engine do not import it; an engine module
    # imported later binds the replaced ServerArgs by itself.
    # retire when: plugin-declared server args (as above), or Engine reads
    # sglang.srt.server_args.ServerArgs at call time.
    engine = sys.modules.get("sglang.srt.entrypoints.engine")
    if engine is not None and engine.Engine.server_args_class is _original_server_args_class():
        HookRegistry.register(
            "sglang.srt.entrypoints.engine.Engine.server_args_class",
            LookaheadServerArgs,
            HookType.REPLACE,
        )
    _installed = True
