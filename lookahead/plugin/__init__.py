"""SGLang plugin entry point: registers the LOOKAHEAD speculative algorithm.

Installed as ``lookahead = lookahead.plugin:register`` in the entry-point group
``sglang.srt.plugins``; SGLang's ``load_plugins()`` calls ``register()`` in the
launcher, the Engine process, and every scheduler / detokenizer / DP-controller
process. ``register()`` is cheap there: it imports only sglang modules those
processes have already imported, and the worker class (``lookahead.plugin.worker``,
which pulls in the trie and torch code) is imported by the worker factory, in
the scheduler, only when LOOKAHEAD is the selected algorithm.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Type

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from lookahead import check_sglang_version
from lookahead.plugin import arg_rules
from lookahead.plugin import server_args as _args

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

ALGORITHM_NAME = _args.ALGORITHM_NAME

# The worker's results are NGRAM's, which the overlap scheduler relays once
# lookahead.plugin.hooks routes them as NGRAM's.
SUPPORTS_OVERLAP = True


class LookaheadSpecAlgo(CustomSpecAlgo):
    """The LOOKAHEAD algorithm as SGLang's schedulers and model runners see it.

    ``CustomSpecAlgo`` duck-types the ``SpeculativeAlgorithm`` enum; in 0.5.23 it
    lacks ``carries_draft_hidden_states``, ``need_topk``, ``create_future_map``
    and ``get_platform_worker_cls``, which the scheduler calls. Everything the
    enum exposes on its members is answered here for a draft-model-free
    algorithm whose drafts come from a host-side trie and are verified like
    NGRAM's (one TARGET_VERIFY forward over a tree of
    ``speculative_num_draft_tokens`` nodes, root included).

    Identity predicates (``is_eagle``, ``is_ngram``, ``is_dflash`` ... all
    False; ``is_speculative`` / ``is_some`` True, ``is_none`` False) are
    inherited from ``CustomSpecAlgo``. In particular ``is_ngram()`` stays False:
    it would make the scheduler build an NGRAM ExternalCorpusManager around our
    worker and route overlap relays through NGRAM's buffers.
    """

    # -- capabilities ---------------------------------------------------------

    def has_draft_kv(self) -> bool:
        # No draft model, hence no draft KV chains: the tree lives only in the
        # verify mask (KV sizing then needs no per-topk page rounding).
        return False

    def carries_draft_hidden_states(self) -> bool:
        # Nothing to ship prefill->decode in PD disaggregation.
        return False

    def need_topk(self) -> bool:
        # No draft top-k tensors to relay between steps.
        return False

    def supports_mixed_chunk(self) -> bool:
        return False

    def supports_target_verify_for_draft(self) -> bool:
        # There is no draft model runner at all.
        return False

    def supports_prefill_shared_read_done(self) -> bool:
        # Same answer as NGRAM (only NONE and the DFLASH family say yes).
        return False

    def supports_ragged_verify(self) -> bool:
        # Uniform verify width per request (num_draft_tokens, zero-padded).
        return False

    def supports_grammar_overlap(self) -> bool:
        # Drafting is host work with no GPU draft phase to hide grammar work
        # under; like NGRAM, grammar batches run synchronously.
        return False

    # -- sizing ---------------------------------------------------------------

    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> int:
        # The verify width is num_draft_tokens, root included (NGRAM's meaning).
        return num_draft_tokens

    # resolve_max_speculative_num_draft_tokens: inherited (the static width;
    # LOOKAHEAD has no adaptive widths).

    # -- construction ---------------------------------------------------------

    def create_future_map(
        self,
        device,
        req_to_token_pool,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ):
        # NGRAM's FutureMap: LOOKAHEAD relays NGRAM's accepted-token payload
        # between overlapped steps, and FutureMap keys its buffers on
        # is_ngram(). The worker sizes the GPU verify mask from seq_lens_cpu,
        # as NGRAM does, so the CPU mirror is always published.
        # retire when: an algorithm can declare that it uses NGRAM's verify
        # flow, and FutureMap asks that instead of is_ngram().
        from sglang.srt.managers.overlap_utils import FutureMap
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        return FutureMap(
            device,
            SpeculativeAlgorithm.NGRAM,
            req_to_token_pool,
            True,
            needs_confidence_relay,
        )

    def get_platform_worker_cls(self) -> Optional[type]:
        # Out-of-tree platforms replace built-in workers by algorithm name; they
        # know nothing of LOOKAHEAD, whose worker is the plugin's on every device.
        return None

    def build_disagg_draft_input(self, batch, last_tokens_tensor, future_map):
        # PD-disaggregated decode starts without a draft input (like NGRAM).
        return None

    def handle_server_args(self, server_args: "ServerArgs") -> None:
        # A copy of SGLang's _handle_ngram rules plus our own checks.
        # retire when: an algorithm can declare that it uses NGRAM's verify
        # flow, so SGLang's _handle_ngram runs for it.
        arg_rules.handle_lookahead_server_args(server_args)
        # The external-corpus endpoints (lookahead.plugin.corpus_server): hooked in the
        # launching process, which serves HTTP, and only for LOOKAHEAD servers.
        from lookahead.plugin.corpus_server import install_tokenizer_side

        install_tokenizer_side()


def _worker_factory(server_args: "ServerArgs") -> Type:
    """The worker class, imported only in a scheduler that runs LOOKAHEAD."""
    from lookahead.plugin.worker import LookaheadWorker

    return LookaheadWorker


_worker_hook_registered = False


def _hybrid_worker_class(original, self, server_args):
    """``SpeculativeAlgorithm.create_worker`` (AROUND): EAGLE's worker class,
    or with ``--speculative-lookahead-hybrid`` its subclass that drafts from
    the trie too (``lookahead.plugin.hybrid_worker``). The algorithm keeps its name,
    so everything else SGLang keys on EAGLE stays EAGLE's."""
    cls = original(self, server_args)
    if not _args.hybrid_enabled(server_args) or getattr(self, "name", None) not in _args.HYBRID_ALGORITHMS:
        return cls
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    from lookahead.plugin.hybrid_worker import LookaheadHybridWorker

    if cls is not EAGLEWorkerV2:
        raise ValueError(
            f"--speculative-lookahead-hybrid builds on SGLang's EAGLE worker (EAGLEWorkerV2); "
            f"this configuration selects {cls.__name__}")
    return LookaheadHybridWorker


def _is_registered() -> bool:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        SpeculativeAlgorithm.from_string(ALGORITHM_NAME)
    except ValueError:
        return False
    return True


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group.

    Registers the LOOKAHEAD algorithm and LOOKAHEAD's server options
    (``lookahead.plugin.server_args``). Idempotent: safe to call several times and in
    every process. Called outside ``load_plugins()`` (e.g. by hand), it still
    works: ``load_plugins()`` applies the option hooks later, or at once here if
    it has already run in this process.
    """
    check_sglang_version()
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if not _is_registered():
        # SGLang's public registration API. LookaheadSpecAlgo answers what
        # CustomSpecAlgo lacks of the enum's interface, and create_future_map
        # asks for NGRAM's relay buffers.
        # retire when: CustomSpecAlgo implements every SpeculativeAlgorithm
        # method with a default, and an algorithm can declare that it uses
        # NGRAM's verify flow (docs/upstream.md).
        SpeculativeAlgorithm.register(
            ALGORITHM_NAME,
            supports_overlap=SUPPORTS_OVERLAP,
            validate_server_args=arg_rules.validate_lookahead_server_args,
            spec_class=LookaheadSpecAlgo,
        )(_worker_factory)
        logger.debug("Registered speculative algorithm %s", ALGORITHM_NAME)

    _args.install()

    # Overrides: SpeculativeAlgorithm.create_worker (AROUND), the worker class
    # the scheduler builds. Why: --speculative-lookahead-hybrid keeps the
    # algorithm EAGLE/EAGLE3 and swaps in EAGLE's worker subclass; every other
    # algorithm and configuration gets SGLang's own class.
    # retire when: a plugin can register a worker subclass for a built-in
    # algorithm, or EAGLE accepts a pluggable extra draft source.
    global _worker_hook_registered
    if not _worker_hook_registered:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register("sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker",
                              _hybrid_worker_class, HookType.AROUND)
        _worker_hook_registered = True

    import sglang.srt.plugins as _plugins
    from sglang.srt.plugins.hook_registry import HookRegistry, _current_plugin_source

    if _plugins._plugins_loaded and _current_plugin_source.get() is None:
        # load_plugins() already ran (and applied hooks) in this process and is
        # not the caller: apply ours now. Targets already patched are skipped.
        HookRegistry.apply_hooks()
