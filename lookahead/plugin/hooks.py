"""The places where SGLang 0.5.23 must know LOOKAHEAD by name.

LOOKAHEAD runs NGRAM's verify flow, but SGLang keys that flow's scheduler,
graph and overlap branches on ``is_ngram()``, which a plugin algorithm cannot
answer True without also getting NGRAM's corpus manager. Each hook below adds
LOOKAHEAD to one such branch and is a no-op for every other algorithm. They
are registered by the worker's constructor, which runs in the scheduler
before any graph is captured or any batch is scheduled, and only in
schedulers that run LOOKAHEAD.

Graphs:

* ``DecodeCudaGraphRunner.get_spec_info`` and ``create_dummy_verify_input``
  (AROUND): the shape-only verify input of graph capture and of the
  flashinfer autotune warm-up, built as SGLang builds NGRAM's.
* ``TpModelWorker.init_cuda_graphs`` (AROUND): on a GPU, the target's startup
  capture becomes the width-1 tier (``lookahead.plugin.verify``): every batch
  size of the server's list at one token per request, instead of the full
  verify width at sizes that never speculate.

Overlap scheduling:

* ``Scheduler._relay_forward_payload`` (AROUND): LOOKAHEAD's results carry
  NGRAM's accepted-token payload, so they are stashed as NGRAM's are.

Sampling and penalties (``lookahead.plugin.penalties``):

* ``ScheduleBatch.cumulate_penalty_output_tokens`` (AROUND): the penalizers
  count every committed token, not the last one of each step.
* ``SamplingBatchInfo.copy_for_forward`` (AROUND): the forward's copy keeps
  a snapshot of the committed penalty state, which it otherwise drops.
* ``ngram_worker.move_accept_tokens_to_target_kvcache`` (AROUND): skipped
  for a width-1 verify (the fallback tier), where it would copy every
  accepted slot onto itself.
* ``IntelAMXAttnBackend.forward_extend`` (AROUND), CPU: a width-1 verify
  (one query per request, the root after its committed prefix) is computed
  by the decode kernel, which is plain decoding's attention for the same
  query and keys; the extend kernel's general path costs more per step.
* ``ngram_worker.commit_mamba_states_after_verify`` (AROUND): the check
  whether the model has mamba state at all is made once, not every step.
* ``ngram_worker.eagle_sample`` (AROUND), for LOOKAHEAD's verify inputs only:
  each tree node gets the penalties of its own path, and on CPU a sampling
  batch is verified by drawing with SGLang's own sampler along the accepted
  path (``lookahead.plugin.cpu_sampling``) rather than greedily; a greedy width-1 verify commits the argmax of each
  root without the tree walk; a custom logit processor is applied as plain
  decoding applies it (SGLang's NGRAM and EAGLE skip it).
"""

from __future__ import annotations

import logging

import torch

from lookahead.plugin.server_args import ALGORITHM_NAME
from lookahead.plugin.verify import LookaheadVerifyInput, capture_verify_input

logger = logging.getLogger(__name__)

_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
_installed = False

# The forward copy of a batch's sampling info carries the snapshot under this name.
PENALTY_SNAPSHOT_ATTR = "lookahead_penalties"


def _is_lookahead(algorithm) -> bool:
    return getattr(algorithm, "name", None) == ALGORITHM_NAME


def _is_lookahead_target(model_runner) -> bool:
    return _is_lookahead(getattr(model_runner, "spec_algorithm", None)) and not model_runner.is_draft_worker


# -- graphs ---------------------------------------------------------------------


def _capture_spec_info(original, self, num_tokens):
    spec_info = original(self, num_tokens)
    if spec_info is None and _is_lookahead_target(self.model_runner):
        spec_info = capture_verify_input(self.buffers.custom_mask, self.captured_req_width)
    return spec_info


def _dummy_verify_input(original, spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker):
    spec_info = original(spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker)
    if spec_info is None and _is_lookahead(spec_algorithm) and not is_draft_worker:
        spec_info = capture_verify_input(custom_mask, num_tokens_per_req)
    return spec_info


def _startup_capture_at_width_one(original, self, *args, **kwargs):
    mr = self.model_runner
    if not _is_lookahead_target(mr) or str(mr.device).startswith("cpu"):
        return original(self, *args, **kwargs)
    from lookahead.plugin.verify import FALLBACK_WIDTH, build_attn_backend, width_override

    # The backend built at start-up has the full width; the worker's
    # init_cuda_graphs gives it to the width-N tier.
    mr.lookahead_full_width_attn_backend = mr.attn_backend
    mr.attn_backend = build_attn_backend(mr, FALLBACK_WIDTH)
    with width_override(FALLBACK_WIDTH):
        return original(self, *args, **kwargs)


# -- overlap --------------------------------------------------------------------


def _relay_payload(original, self, batch, future_indices, batch_result):
    if not _is_lookahead(self.spec_algorithm):
        return original(self, batch, future_indices, batch_result)
    from sglang.srt.managers.overlap_utils import RelayPayload

    # Same as SGLang's NGRAM branch: the accepted tokens relay to the next step.
    if batch_result.next_draft_input is not None:
        self.future_map.stash(future_indices, RelayPayload.from_ngram(batch_result.next_draft_input))


# -- sampling and penalties -------------------------------------------------------


def _cumulate_every_token(original, self):
    if not _is_lookahead(self.spec_algorithm):
        return original(self)
    from lookahead.plugin.penalties import cumulate_new_output_tokens

    cumulate_new_output_tokens(self)


def _copy_with_penalties(original, self):
    copy = original(self)
    orchestrator = self.penalizer_orchestrator
    if orchestrator is not None and orchestrator.is_required:
        batch = orchestrator.batch
        if batch is not None and _is_lookahead(batch.spec_algorithm):
            from lookahead.plugin.penalties import PenaltySnapshot

            setattr(copy, PENALTY_SNAPSHOT_ATTR, PenaltySnapshot.take(orchestrator, batch.reqs))
    return copy


def _sample_tree(original, verify_input, batch, logits_output, grammar_mask=None, *args, **kwargs):
    if not isinstance(verify_input, LookaheadVerifyInput):
        return original(verify_input, batch, logits_output, grammar_mask, *args, **kwargs)
    info = batch.sampling_info
    logits = logits_output.next_token_logits
    snapshot = getattr(info, PENALTY_SNAPSHOT_ATTR, None)
    saved = {}  # sampling-info fields already applied here, blanked for what follows

    def blank(*fields):
        for field in fields:
            saved.setdefault(field, getattr(info, field))
            setattr(info, field, None)

    if snapshot is not None and verify_input.penalty_inputs is not None:
        snapshot.node_logits(logits, *verify_input.penalty_inputs)
        # Applied node by node above, so eagle_sample must not add the
        # committed-only version on top.
        blank("acc_additive_penalties", "acc_scaling_penalties")
    if info.has_custom_logit_processor:
        # The worker verifies such batches at width 1 (a processor may read
        # the request's committed output, which a deeper node would extend),
        # so each row is a request's next position. Plain decoding's order:
        # the logit changes, then the processor.
        _apply_logit_changes(logits, info, grammar_mask)
        from sglang.srt.layers.sampler import apply_custom_logit_processor

        apply_custom_logit_processor(logits, info)
        blank("acc_additive_penalties", "acc_scaling_penalties", "logit_bias")
        grammar_mask = None
    try:
        if verify_input.draft_token_num == 1 and _argmax_decides(info, kwargs.get("watermark_state")):
            return _roots_argmax(verify_input, info, logits_output, grammar_mask)
        if logits.device.type == "cpu" and not info.is_all_greedy:
            from lookahead.plugin.cpu_sampling import tree_sampling_verify

            return tree_sampling_verify(verify_input, batch, logits_output, grammar_mask)
        return original(verify_input, batch, logits_output, grammar_mask, *args, **kwargs)
    finally:
        for field, value in saved.items():
            setattr(info, field, value)


def _argmax_decides(info, watermark_state) -> bool:
    """Whether a width-1 verify is plain greedy decoding: an all-greedy batch
    with no watermark and no simulated acceptance."""
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_LEN

    return (info.is_all_greedy and SIMULATE_ACC_LEN <= 0
            and (watermark_state is None or not info.has_watermark_candidates))


def _apply_logit_changes(logits, info, grammar_mask) -> None:
    """What ``eagle_sample`` changes in a width-1 verify's logits before it
    picks (at width 1 its per-node repeats are the rows themselves)."""
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
    from sglang.srt.utils.async_probe import sanitize_nan_logits

    sanitize_nan_logits(logits, "verify: target model logits")
    if info.acc_additive_penalties is not None:
        logits.add_(info.acc_additive_penalties)
    if info.acc_scaling_penalties is not None:
        apply_scaling_penalties(logits, info.acc_scaling_penalties)
    if info.logit_bias is not None:
        logits.add_(info.logit_bias)
    if grammar_mask is not None:
        grammar_mask.apply(logits)


def _roots_argmax(verify_input, info, logits_output, grammar_mask):
    """``eagle_sample`` for a tree of one node per request, greedy: the
    fallback tier's every step. Each request commits the target's argmax at
    its root, after the same logit changes ``eagle_sample`` makes, without
    the tree walk."""
    logits = logits_output.next_token_logits
    _apply_logit_changes(logits, info, grammar_mask)
    predict = torch.argmax(logits, dim=-1).to(torch.int32)
    # Node i is request i's root: the width-1 retrieve_index is arange(bs).
    accept_index = verify_input.retrieve_index.to(torch.int32)
    accept_lens = torch.ones_like(predict)
    return predict, accept_lens, accept_index


def _skip_width_one_move(original, batch, accept_index, num_correct_drafts, *args, **kwargs):
    spec = batch.spec_info
    if isinstance(spec, LookaheadVerifyInput) and spec.draft_token_num == 1:
        # A width-1 verify accepts its root alone, whose K/V the forward
        # wrote into the slot it keeps: the move would copy every slot onto itself.
        return None
    return original(batch, accept_index, num_correct_drafts, *args, **kwargs)


def _width_one_verify_as_decode(original, self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None):
    spec = forward_batch.spec_info
    if (not isinstance(spec, LookaheadVerifyInput) or spec.draft_token_num != 1
            or not forward_batch.forward_mode.is_target_verify() or not save_kv_cache
            or k is None or layer.is_cross_attention or self.draft_decode_metadata is not None):
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, sinks)
    from sglang.srt.layers.radix_attention import AttentionType

    if layer.attn_type == AttentionType.ENCODER_ONLY:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, sinks)
    # The backend's verify metadata holds the lengths with the root counted
    # (committed + 1): what a decode step's seq_lens are. The decode kernel
    # writes the root's K/V at out_cache_loc itself, as in plain decoding.
    seq_lens = self.extend_metadata[0]
    self.draft_decode_metadata = (self.req_to_token_pool.req_to_token, seq_lens, forward_batch.req_pool_indices)
    try:
        return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=True, sinks=sinks)
    finally:
        self.draft_decode_metadata = None


def _commit_mamba_if_any(original, target_worker, *args, **kwargs):
    # SGLang returns at once for a model without mamba state, after a config
    # check that costs as much as a small kernel; the answer is kept here.
    model_runner = target_worker.model_runner
    has_state = getattr(model_runner, "_lookahead_has_mamba_state", None)
    if has_state is None:
        from sglang.srt.configs.hybrid_arch import mambaish_config

        has_state = mambaish_config(model_runner.model_config) is not None
        model_runner._lookahead_has_mamba_state = has_state
    if has_state:
        return original(target_worker, *args, **kwargs)
    return None


# -- LOOKAHEAD + EAGLE (lookahead.plugin.hybrid_worker) ------------------------------------

_hybrid_installed = False
_capture_scores = False
_eagle_scores = None


def _keep_eagle_scores(original, score_list, token_list, parents_list, num_draft_token):
    """EAGLE's tree selection (top-k > 1): keep the chosen nodes' scores, the
    draft model's path probabilities, which the hybrid values its nodes by."""
    global _eagle_scores
    out = original(score_list, token_list, parents_list, num_draft_token)
    if _capture_scores:
        import torch

        _eagle_scores = torch.gather(torch.cat(score_list, dim=1).flatten(1), 1, out[1])
    return out


def take_eagle_scores():
    """The scores of EAGLE's last tree selection ([bs, num_draft_tokens - 1],
    in its nodes' order), or None; clears them."""
    global _eagle_scores
    scores, _eagle_scores = _eagle_scores, None
    return scores


def _report_stats(original, self, state):
    original(self, state)
    worker = getattr(self.scheduler, "draft_worker", None)
    for key, method in (("lookahead", "lookahead_stats"), ("lookahead_hybrid", "lookahead_hybrid_stats")):
        stats = getattr(worker, method, None)
        if stats is not None:
            state[key] = stats()


# /set_internal_state keys a LOOKAHEAD server takes, with what each does.
CLEAR_HISTORY = "speculative_lookahead_clear_history"


def _lookahead_handlers(original, self):
    handlers = original(self)
    worker = getattr(self.scheduler, "draft_worker", None)
    cache = getattr(worker, "cache", None)
    if cache is None or not hasattr(cache, "clear_history"):
        return handlers
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected, _UpdateHandler

    def validate(key, value):
        if value is not True:
            raise UpdateRejected(f"{key} takes true (clear the history), got {value!r}")

    def apply(key, value):
        dropped = cache.clear_history()
        logger.info("LOOKAHEAD: history cleared (%d shared tokens dropped)", dropped)

    return {**handlers, CLEAR_HISTORY: _UpdateHandler(validate, apply)}


def install_hybrid() -> None:
    """The hooks of LOOKAHEAD + EAGLE (idempotent), applied in the scheduler
    that runs the hybrid worker:

    * ``eagle_utils.organize_draft_results`` (AROUND): EAGLE's top-k > 1 tree
      selection drops its nodes' scores; the hybrid keeps them
      (``take_eagle_scores``). A no-op until a hybrid worker exists.
    * the internal-state hooks of ``_install_internal_state``.
    """
    global _hybrid_installed, _capture_scores
    _capture_scores = True
    if _hybrid_installed:
        return
    _register_and_apply((
        # retire when: EAGLE's verify input keeps the selected nodes' scores.
        ("sglang.srt.speculative.eagle_utils.organize_draft_results", _keep_eagle_scores),
    ))
    _install_internal_state()
    _hybrid_installed = True


_internal_state_installed = False
_INTERNAL_STATE = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"


def _install_internal_state() -> None:
    """``/get_server_info`` and ``/set_internal_state`` for LOOKAHEAD (once per process):

    * ``SchedulerInternalStateController._add_speculative`` (AROUND): the
      trie's and the steps' stats under ``internal_states[i]["lookahead"]``
      (the hybrid's under ``["lookahead_hybrid"]``);
    * ``SchedulerInternalStateController._update_handlers`` (AROUND): the
      key ``speculative_lookahead_clear_history``, as SGLang's own
      ``dspark_clear_info_records`` clears a worker's records.
    """
    global _internal_state_installed
    if _internal_state_installed:
        return
    _register_and_apply((
        # retire when: a speculative worker can add its own entry to the internal state.
        (f"{_INTERNAL_STATE}._add_speculative", _report_stats),
        # retire when: a speculative worker can register its own internal-state commands.
        (f"{_INTERNAL_STATE}._update_handlers", _lookahead_handlers),
    ))
    _internal_state_installed = True


def _register_and_apply(hooks) -> None:
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook in hooks:
        # The registry resolves targets by attribute: their modules must be loaded.
        module = target
        while module:
            module = module.rpartition(".")[0]
            try:
                importlib.import_module(module)
                break
            except ImportError:
                continue
        HookRegistry.register(target, hook, HookType.AROUND)
    HookRegistry.apply_hooks()


def install() -> None:
    """Register and apply every hook (idempotent)."""
    global _installed
    if _installed:
        return
    # One line per hook in docs/upstream.md (why, and what would retire it).
    _register_and_apply((
        # retire when: an algorithm can declare that it uses NGRAM's verify flow.
        (f"{_RUNNER}.get_spec_info", _capture_spec_info),
        # retire when: an algorithm can declare that it uses NGRAM's verify flow.
        ("sglang.srt.speculative.spec_info.create_dummy_verify_input", _dummy_verify_input),
        # retire when: SGLang supports several verify widths per server, each
        # with its own batch sizes and graphs.
        ("sglang.srt.managers.tp_worker.TpModelWorker.init_cuda_graphs", _startup_capture_at_width_one),
        # retire when: an algorithm can declare that it uses NGRAM's verify flow.
        ("sglang.srt.managers.scheduler.Scheduler._relay_forward_payload", _relay_payload),
        # retire when: the penalizers count every token a speculative step commits.
        ("sglang.srt.managers.schedule_batch.ScheduleBatch.cumulate_penalty_output_tokens",
         _cumulate_every_token),
        # retire when: speculative verification applies penalties per tree path.
        ("sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.copy_for_forward", _copy_with_penalties),
        # retire when: eagle_sample has per-path penalties and custom logit
        # processors, a CPU tree-sampling kernel and a width-1 fast path.
        ("sglang.srt.speculative.ngram_worker.eagle_sample", _sample_tree),
        # retire when: NGRAM's flow skips the move when every request accepts
        # only its root (or supports a per-step verify width).
        ("sglang.srt.speculative.ngram_worker.move_accept_tokens_to_target_kvcache", _skip_width_one_move),
        # retire when: SGLang caches whether the model has mamba state.
        ("sglang.srt.speculative.ngram_worker.commit_mamba_states_after_verify", _commit_mamba_if_any),
        # retire when: intel_amx routes a single-token TARGET_VERIFY to its decode kernel.
        ("sglang.srt.layers.attention.intel_amx_backend.IntelAMXAttnBackend.forward_extend",
         _width_one_verify_as_decode),
    ))
    _install_internal_state()
    _installed = True
    logger.debug("LOOKAHEAD: SGLang hooks installed")
