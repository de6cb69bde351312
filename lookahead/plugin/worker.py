"""``LookaheadWorker``: SGLang's NGRAM worker, drafting from LOOKAHEAD's trie.

The verify flow is ``NGRAMWorker.forward_batch_generation``, unchanged: one
TARGET_VERIFY forward over the draft trees, the grammar vocab mask over the
tree, ``eagle_sample``, mamba state, watermarks, the KV compaction, logprobs
and the result the scheduler relays (overlap included). What this subclass
supplies is what differs:

* the drafts (``_prepare_draft_tokens``): the trie (``lookahead.trie.cache``), fed
  by ``lookahead.plugin.request_feed`` with every committed token once, including
  the previous step's tokens that overlap scheduling has not yet put in
  ``output_ids``;
* the tree layout (``_prepare_for_speculative_decoding``): the step's width
  from ``lookahead.plugin.verify`` (N up to the max batch size, 1 above it,
  free on CPU), preallocated buffers, the GPU mask built on the device;
* the CUDA-graph tiers (``init_cuda_graphs``);
* the stats, metrics and persistence of the trie.

Sampling stays ``eagle_sample``, reached through ``lookahead.plugin.hooks``
for the per-node penalties and the CPU sampling verifier.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
from typing import Optional

import torch

from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_func
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_device, get_parallel, get_schedule, get_spec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.ngram_info import NgramVerifyInput
from sglang.srt.speculative.ngram_worker import NGRAMWorker
from sglang.srt.speculative.spec_utils import prepare_mamba_track_for_verify
from sglang.srt.utils import is_cpu

from lookahead.plugin import hooks as sglang_hooks
from lookahead.trie.cache import Draft, LookaheadCache
from lookahead.plugin.verify_cost import VerifyCost, batch_draft_width
from lookahead.plugin.request_feed import RequestFeed
from lookahead.plugin.server_args import get_lookahead_args
from lookahead.plugin.step_policy import GREEDY, StepPolicy, batch_kind, calibrate, new_calibration
from lookahead.plugin.penalties import reset_counts
from lookahead.plugin.verify import LookaheadVerifyInput
from lookahead.plugin.verify import FALLBACK_WIDTH, VerifyTiers, WidthPlan
from lookahead.plugin.verify import full_verify_mask, pack_drafts
from lookahead.plugin.stats import StepStats
from lookahead.plugin.share import start_for_worker as start_share
from lookahead.plugin.worker_corpora import ExternalCorpora

logger = logging.getLogger(__name__)

_is_cpu = is_cpu()

# With --speculative-lookahead-path, the trie is saved whenever the server
# drains, unless the last save was less than this many of its own durations
# ago (so saving takes at most ~1/SAVE_DUTY of the time), and at exit when the
# process exits normally.
SAVE_DUTY = 10.0

_NO_DRAFT = Draft([], [])

# With --speculative-lookahead-max-batch-size auto and tensor parallelism,
# every rank adopts rank 0's step costs every this many decode steps.
POLICY_SYNC_STEPS = 32


# Replaces NGRAMWorker's private drafting methods (docs/upstream.md).
# retire when: NGRAM's worker takes a pluggable drafter and a per-step verify width.
class LookaheadWorker(ExternalCorpora, NGRAMWorker):
    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int,
        nccl_port: int,
        target_worker: TpModelWorker,
    ):
        # NGRAMWorker.__init__ builds NGRAM's corpus, which the trie replaces:
        # the attributes its verify flow reads are set here instead.
        BaseSpecWorker.__init__(self)
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = get_device().device
        self.enable_overlap = not get_schedule().disable_overlap_schedule
        self.page_size = get_schedule().page_size
        self.args = get_lookahead_args(server_args)
        self.speculative_num_draft_tokens = self.args.num_draft_tokens  # N, root included
        self.draft_token_num = self.speculative_num_draft_tokens  # this step's width
        self.topk = get_spec().speculative_eagle_topk
        self.speculative_num_steps = get_spec().speculative_num_steps
        self.adaptive_controller = None
        self._prev_decode_rids: set = set()
        self.grammar_tree_host = None
        self.tp_size = get_parallel().tp_size
        # --speculative-lookahead-fixed-width: the full width every speculating
        # step, as on a GPU, so acceptance per step is measured as it would be there.
        self.plan = WidthPlan(self.speculative_num_draft_tokens, self.args.speculation_bound,
                              free_width=_is_cpu and not self.args.fixed_width)
        self.tiers: Optional[VerifyTiers] = None
        # (width, reason, expected drafts, read the previous step's tokens back) of the decode step being run
        self._step = None
        # --speculative-lookahead-max-batch-size auto: measured per step.
        self.policy = StepPolicy(self.args.speculation_bound, local_costs=self.tp_size == 1) \
            if self.args.adaptive else None
        # Measured acceptance over the trie's scores, greedy and sampled apart (shared with the policy).
        self.calibration = self.policy.calibration if self.policy is not None else new_calibration()
        self._timed = None  # (batch size, width, start) of the last decode step (for policy and verify_cost)
        # Where widths follow the drafts (no graph tiers), a drafted token must
        # be worth its measured verify cost. Not with tensor parallelism: every
        # rank must draft the same trees, and its timings are its own.
        self.verify_cost = VerifyCost() if self.plan.free_width and self.tp_size == 1 else None
        self._floor = 0.0  # the score a node must clear this step (verify_cost): 0 prunes nothing
        self._committed = 0  # tokens the last verify committed
        self._expected = collections.deque(maxlen=16)  # per decode step awaiting its acceptance: (expected, kind)
        self._decode_steps = 0

        sglang_hooks.install()  # before the scheduler captures any graph
        from lookahead.plugin.corpus_server import install_scheduler_side

        install_scheduler_side()  # the external-corpus endpoints, before the scheduler binds its handlers
        self.cache = self._load_cache()
        self.max_trie_depth = self.cache.config.max_match_len  # context tokens a draft reads
        self.feed = RequestFeed(self.cache, on_finish=self._finished, isolation=self.args.isolation)
        self.share = start_share(self, server_args)  # --speculative-lookahead-share (lookahead.plugin.share)
        self.stats = StepStats()
        if getattr(server_args, "enable_metrics", False):
            from lookahead.plugin.stats import LookaheadMetrics

            labels = {"model_name": server_args.served_model_name or server_args.model_path,
                      "tp_rank": str(get_parallel().tp_rank)}
            self.stats.listeners.append(LookaheadMetrics(labels, self.cache.stats))
        self._dirty = False
        self._last_save = float("-inf")
        self._save_seconds = 0.0
        self._save_lock = threading.Lock()
        if self.args.path:
            atexit.register(self.save_trie, False)  # at exit: a blocking save
        self._load_startup_corpora()
        logger.info(
            "LOOKAHEAD worker: verify width %d (%s), speculating at batch sizes 1..%d%s, overlap %s, trie %s",
            self.speculative_num_draft_tokens, "one branch" if self.args.one_branch else "tree",
            self.args.speculation_bound, " where measured to pay (auto)" if self.args.adaptive else "",
            "on" if self.enable_overlap else "off", self.cache.config,
        )

    # -- SGLang worker interface ------------------------------------------------

    @property
    def ngram_corpus(self) -> RequestFeed:
        # NGRAMWorker's verify flow tells its corpus which requests left the
        # decode batch; the request feed is what holds per-request state here.
        return self.feed

    def alloc_memory_pool(self, **kwargs):
        # The target's pools are shared (no draft model, no draft KV).
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()
        self.max_batch_size = self.model_runner.max_running_requests
        nodes = self.max_batch_size * self.speculative_num_draft_tokens
        self._buffers = {name: torch.empty((nodes,), dtype=torch.int64, device=self.device)
                         for name in ("tokens", "positions", "retrieve_index", "next_token", "next_sibling")}
        self._buffers["tree_mask"] = torch.empty(
            (nodes * self.speculative_num_draft_tokens,), dtype=torch.bool, device=self.device)
        self._full_mask = torch.empty((0,), dtype=torch.bool, device=self.device)
        self._node_index = torch.arange(nodes, dtype=torch.int64, device=self.device)

    def init_cuda_graphs(self):
        """On a GPU: the width-N verify tier next to the width-1 tier SGLang's
        startup capture built (see ``sglang_hooks``); nothing on CPU."""
        mr = self.model_runner
        if _is_cpu:
            return
        self.tiers = VerifyTiers(self.plan, mr)
        self.tiers.adopt_startup(FALLBACK_WIDTH)
        full = self.speculative_num_draft_tokens
        if full != FALLBACK_WIDTH and self.plan.max_batch_size > 0:
            backend = getattr(mr, "lookahead_full_width_attn_backend", None) or mr.attn_backend
            self.tiers.build(full, backend, capture=self.tiers.uses_graphs)
        self.tiers.activate(FALLBACK_WIDTH)

    def clear_cache_pool(self):
        # Called when the scheduler flushes its caches while idle: no request
        # is live any more. The shared history is kept: it is about text, not
        # about the KV cache that was flushed.
        self.feed.finish_all()
        self._prev_decode_rids = set()

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list, batch_size: int = 0) -> None:
        self.stats.record_accept(num_correct_drafts_per_req)
        self._committed = sum(num_correct_drafts_per_req) + len(num_correct_drafts_per_req)
        if self._expected:
            expected, kind = self._expected.popleft()  # results arrive in step order
            if expected:
                calibrate(self.calibration, kind, sum(num_correct_drafts_per_req), expected)

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        self.feed.finish(rid)

    def forward_batch_generation(self, batch: ScheduleBatch, on_publish=None, pp_proxy_tensors=None):
        self.feed.sweep()
        self.draft_token_num = self.speculative_num_draft_tokens
        self._step = None
        if self.policy is not None or self.verify_cost is not None:
            self._time_step(batch)
        if batch.forward_mode.is_extend():
            self.feed.start(batch.reqs)
            reset_counts(batch.reqs)  # a prefill gives the requests fresh penalizer rows
        result = super().forward_batch_generation(batch, on_publish=on_publish, pp_proxy_tensors=pp_proxy_tensors)
        if self._step is not None:
            width, reason, expected, waited = self._step
            # Rows of this step's tokens are `width` wide; what relays to the
            # next step is laid out at the full width, so batches merge.
            result.speculative_output_stride = width
            result.next_draft_input = self._full_width(result.next_draft_input, width)
            self.stats.record_step(width, bool(result.can_run_cuda_graph), reason, waited)
            if self._timed is not None:
                self._timed = (len(batch.reqs), width, self._timed[2])
            self._expected.append((expected, batch_kind(batch.sampling_info)))
            self.stats.maybe_log(self.cache.stats, self.policy)
        self.draft_token_num = self.speculative_num_draft_tokens
        return result

    def _time_step(self, batch: ScheduleBatch) -> None:
        """The previous decode step's cost is the time to this one; a prefill
        in between makes it no decode step's cost. It goes to ``StepPolicy``
        (``auto``) and to ``verify_cost``, whose floor this step's drafts then
        keep to."""
        now = time.perf_counter()
        if self._timed is not None and self._timed[0] is not None and batch.forward_mode.is_decode():
            bs, width, start = self._timed
            if self.policy is not None:
                self.policy.record_cost(bs, width > 1, now - start)
            if self.verify_cost is not None:
                self.verify_cost.record(bs * width, self._committed, now - start, bs)
        if self.verify_cost is not None and batch.forward_mode.is_decode():
            # Greedy scores are taken as they are; sampled ones as measured.
            kind = batch_kind(batch.sampling_info)
            self._floor = self.verify_cost.min_score(1.0 if kind == GREEDY else self.calibration[kind])
        self._timed = (None, 1, now) if batch.forward_mode.is_decode() else None
        if self.policy is not None and batch.forward_mode.is_decode() and self.tp_size > 1:
            self._decode_steps += 1
            if self._decode_steps % POLICY_SYNC_STEPS == 0:
                # Every rank decides from rank 0's measurements, adopted at the same step.
                self.policy.adopt(get_parallel().tp_group.broadcast_object(self.policy.measured_table(), src=0))

    def _update_ngram_corpus(self, batch: ScheduleBatch):
        # The trie is fed before drafting (_prepare_draft_tokens), not after verify.
        pass

    # -- drafting ----------------------------------------------------------------

    def _late_tokens(self, batch: ScheduleBatch) -> Optional[tuple]:
        """``(accept_tokens, accept_lens)`` of the previous step, on the device,
        where they are not in ``output_ids`` yet: under overlap scheduling
        results are processed one step late (NGRAM's splice; grammar batches
        are processed in time)."""
        if not self.enable_overlap or batch.grammar_needs_sync() or batch.spec_info is None:
            return None
        tokens, lens = batch.spec_info.accept_tokens, batch.spec_info.accept_lens
        if tokens is None or lens is None:
            return None
        return tokens, lens

    @staticmethod
    def _pending_tokens(late: Optional[tuple]) -> Optional[list]:
        """Per request, the late tokens as host lists: a wait for the previous
        step's forward, which only a step that drafts (or counts penalties) pays."""
        if late is None:
            return None
        tokens, lens = late[0].cpu().tolist(), late[1].cpu().tolist()
        stride = len(tokens) // max(1, len(lens))
        return [tokens[i * stride: i * stride + n] for i, n in enumerate(lens)]

    @staticmethod
    def _late_roots(late: tuple) -> torch.Tensor:
        """Each request's last late token, gathered on the device: the root of
        a width-1 step under overlap, read without waiting for the previous
        forward, as plain decoding reads its next input. Every relayed row
        holds at least one token (a prefill's first, or a verify's bonus)."""
        tokens, lens = late
        bs = lens.shape[0]
        last = (lens.to(torch.int64) - 1).clamp_min(0).view(bs, 1)
        return tokens.view(bs, -1).gather(1, last).view(bs).to(torch.int64)

    def _prepare_draft_tokens(self, batch: ScheduleBatch) -> tuple:
        """The step's trees: ``(tokens [bs * W], ancestor mask [bs * W * W])``,
        with the width and reason recorded in ``self._step``. A step that
        drafts nothing under overlap returns its roots as a device tensor and
        no mask (width 1): it reads nothing back from the device."""
        bs = len(batch.reqs)
        late = self._late_tokens(batch)
        # "fallback": above the max batch size nothing is drafted; outputs
        # reach the trie when speculation resumes, or when the request ends.
        reason, drafts, expected = "fallback", None, None
        speculates = self.plan.speculates(bs)
        kind = batch_kind(batch.sampling_info)
        drafting = speculates and (self.policy is None or self.policy.wants_drafts(bs, kind))
        if speculates and batch.sampling_info.has_custom_logit_processor:
            # A processor sees a request's committed output (``__req__``), not a
            # tree node's path: such a batch decodes one token per request.
            reason, drafting = "custom_logit_processor", False
        counts_penalties = getattr(batch.sampling_info, sglang_hooks.PENALTY_SNAPSHOT_ATTR, None) is not None
        if late is not None and not drafting and not counts_penalties and not batch.has_grammar:
            if self.policy is not None and reason != "custom_logit_processor":
                reason = self.policy.decide(bs, None).reason
            self._step = (FALLBACK_WIDTH, reason, None, False)
            self._penalty_uncounted = None
            self._trees = None
            return self._late_roots(late), None
        pending = self._pending_tokens(late)
        if drafting:
            contexts = [self._context(req, pending[i] if pending is not None else ())
                        for i, req in enumerate(batch.reqs)]
            drafts = self._draft(batch, contexts, pending)
            expected = sum(d.expected for d in drafts) if drafts is not None else 0.0
            reason = "verify" if drafts is not None else "no_draft"
        if self.policy is not None and reason != "custom_logit_processor":
            decision = self.policy.decide(bs, expected, kind)
            reason = decision.reason
            if not decision.speculate:
                drafts = None
        roots = [self._last_token(req, pending[i] if pending is not None else ())
                 for i, req in enumerate(batch.reqs)]
        width = self.plan.width(bs, max(len(d) for d in drafts) if drafts is not None else 0)
        trees = pack_drafts(drafts or [_NO_DRAFT] * bs, roots, width)
        self._step = (width, reason, expected if drafts is not None else None, pending is not None)
        self._penalty_uncounted = self._uncounted(batch, pending) if counts_penalties else None
        self._trees = trees
        return trees.tokens, trees.mask

    def _context(self, req, pending) -> list:
        """The last ``max_match_len`` tokens of prompt + output + pending: what a draft reads."""
        return RequestFeed.context_of(req, pending, self.max_trie_depth)

    @staticmethod
    def _last_token(req, pending) -> int:
        """The root of the request's verify tree: its last committed token."""
        if pending:
            return pending[-1]
        return req.output_ids[-1] if req.output_ids else RequestFeed.prompt_of(req)[-1]

    def _draft(self, batch: ScheduleBatch, contexts: list, pending) -> Optional[list]:
        """One draft per request of the batch, or None when all are empty."""
        reqs = self.feed.sync(batch.reqs, pending)
        if len(reqs) != len(batch.reqs):
            return None  # a request unknown to the trie: verify nothing this step
        if self.tp_size > 1:
            # Every rank must verify the same tree: with every insert applied,
            # identical calls give identical drafts on every rank.
            self.cache.synchronize()
        t0 = time.perf_counter()
        rids = [r.rid for r in reqs]
        drafts = self.cache.batch_draft(rids, contexts, self.speculative_num_draft_tokens - 1, self.args.one_branch)
        if self._floor > 0:
            # Every request verifies at the batch's width: it is the one the
            # batch's nodes pay for together (batch_draft_width), and a draft
            # shorter than it fills the slots it pays for anyway with its best
            # nodes below the floor. Drafts are best-first, so a prefix is the
            # best draft of its length.
            width = batch_draft_width([d.scores for d in drafts], self._floor)
            drafts = [d if len(d) <= width else
                      Draft(d.tokens[:width], d.parents[:width], sum(d.scores[:width]), d.scores[:width])
                      for d in drafts]
        drafted = sum(len(d) for d in drafts)
        self.stats.record_draft(time.perf_counter() - t0, drafted, len(reqs))
        return drafts if drafted else None

    @staticmethod
    def _uncounted(batch: ScheduleBatch, pending) -> list:
        """Committed output tokens each request's penalizer rows have not
        counted yet (``lookahead.plugin.penalties``)."""
        snapshot = getattr(batch.sampling_info, sglang_hooks.PENALTY_SNAPSHOT_ATTR)
        out = []
        for i, (req, counted) in enumerate(zip(batch.reqs, snapshot.counted)):
            committed = list(req.output_ids[counted:])
            out.append(committed + list(pending[i]) if pending is not None else committed)
        return out

    # -- the verify tree ------------------------------------------------------------

    def _prepare_for_speculative_decoding(self, batch: ScheduleBatch):
        # Extend goes through the plain target forward, and an IDLE batch keeps
        # its forward_mode.
        if not batch.forward_mode.is_decode():
            return
        bs = len(batch.reqs)
        tokens, mask = self._prepare_draft_tokens(batch)
        width = self._step[0]
        self.draft_token_num = width  # NGRAMWorker's verify flow reads the step's width here
        if self.tiers is not None:
            self.tiers.activate(width)
        # Staged for the grammar bitmask, which NGRAM's flow derives after the verify launch.
        self.grammar_tree_host = (mask, tokens) if batch.has_grammar else None

        n = bs * width
        buf = self._buffers
        draft_tokens = buf["tokens"][:n]
        tree_mask = buf["tree_mask"][: n * width]
        if mask is None:  # the roots, on the device already (width 1)
            draft_tokens.copy_(tokens)
            tree_mask.fill_(True)
        else:
            draft_tokens.copy_(torch.from_numpy(tokens), non_blocking=True)
            tree_mask.copy_(torch.from_numpy(mask), non_blocking=True)
        positions = buf["positions"][:n]
        retrieve_index = buf["retrieve_index"][:n].view(bs, width)
        retrieve_next_token = buf["next_token"][:n].view(bs, width)
        retrieve_next_sibling = buf["next_sibling"][:n].view(bs, width)
        if width == 1:
            # The root alone: it sits at the committed length, links to
            # nothing, and its K/V goes to the slot reserved there (one gather).
            positions.copy_(batch.seq_lens)
            retrieve_index.copy_(self._node_index[:bs].view(bs, 1))
            retrieve_next_token.fill_(-1)
            retrieve_next_sibling.fill_(-1)
            out_cache_loc = batch.req_to_token_pool.req_to_token[
                batch.req_pool_indices, batch.seq_lens].to(torch.int64)
        else:
            reconstruct_indices_from_tree_mask_func(
                tree_mask, batch.seq_lens, positions, retrieve_index, retrieve_next_token,
                retrieve_next_sibling, bs, width,
            )
            out_cache_loc = assign_extend_cache_locs_func(
                req_pool_indices=batch.req_pool_indices,
                req_to_token=batch.req_to_token_pool.req_to_token,
                start_offset=batch.seq_lens,
                end_offset=batch.seq_lens + width,
                batch_size=bs,
                draft_token_num=width,
                device=self.device,
            )
        custom_mask = tree_mask  # the CPU backend takes the tree part only
        if not _is_cpu:
            seq_lens_sum = int(batch.seq_lens_cpu.sum())
            needed = width * (seq_lens_sum + bs * width)
            if self._full_mask.numel() < needed:
                self._full_mask = torch.empty((max(needed, 2 * self._full_mask.numel()),),
                                              dtype=torch.bool, device=self.device)
            custom_mask = full_verify_mask(tree_mask, batch.seq_lens, seq_lens_sum, width, self._full_mask)

        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.input_ids = draft_tokens
        batch.out_cache_loc = out_cache_loc
        prepare_mamba_track_for_verify(batch)
        penalty_inputs = None
        if self._penalty_uncounted is not None:
            penalty_inputs = (tokens, mask, self._penalty_uncounted)
        batch.spec_info = LookaheadVerifyInput(
            draft_token=draft_tokens,
            custom_mask=custom_mask,
            positions=positions,
            retrieve_index=retrieve_index,
            retrieve_next_token=retrieve_next_token,
            retrieve_next_sibling=retrieve_next_sibling,
            draft_token_num=width,
            is_chain=self._trees is None or self._trees.is_chain,
            penalty_inputs=penalty_inputs,
        )

    def _full_width(self, draft_input: NgramVerifyInput, width: int) -> NgramVerifyInput:
        full = self.speculative_num_draft_tokens
        if draft_input is None or width == full:
            return draft_input
        bs = draft_input.accept_lens.shape[0]
        tokens = draft_input.accept_tokens
        padded = torch.zeros((bs, full), dtype=tokens.dtype, device=tokens.device)
        padded[:, :width] = tokens.reshape(bs, width)
        return NgramVerifyInput(
            draft_token_num=full,
            new_seq_lens=draft_input.new_seq_lens,
            accept_tokens=padded.flatten(),
            accept_lens=draft_input.accept_lens,
        )

    # -- request lifecycle and persistence ---------------------------------------------

    def _finished(self, rid) -> None:
        self._dirty = True
        if (not len(self.feed) and self.args.path
                and time.monotonic() - self._last_save >= SAVE_DUTY * self._save_seconds):
            # The server drained: persist now. SGLang ends its schedulers with
            # SIGKILL, so the exit hook cannot be relied on.
            self.save_trie()

    def _load_cache(self) -> LookaheadCache:
        overrides = self.args.cache_overrides()
        vocab = getattr(self.model_runner.model_config, "vocab_size", None)
        if vocab:
            overrides["vocab_size"] = int(vocab)
        # No file: empty. A damaged file is set aside as PATH.corrupt with a
        # warning, and the server starts with an empty history.
        cache = LookaheadCache.open(self.args.path, **overrides)
        if self.args.path and cache.stats()["shared_tokens"]:
            logger.info("LOOKAHEAD: loaded %d shared tokens from %s", cache.stats()["shared_tokens"], self.args.path)
        return cache

    def save_trie(self, background: bool = True) -> None:
        """Write every scope's history to ``--speculative-lookahead-path`` (rank 0),
        from the cache's own thread unless ``background`` is False (at exit)."""
        if not self.args.path or get_parallel().tp_rank != 0 or not self._dirty:
            return
        with self._save_lock:
            self._dirty = False
            self._last_save = time.monotonic()
            try:
                if not background:
                    self.cache.save(self.args.path)  # waits for a background save first
                    return
                self.cache.save(self.args.path, background=True).add_done_callback(self._saved)
            except Exception:
                self._dirty = True
                logger.exception("LOOKAHEAD: could not save the trie to %s", self.args.path)

    def _saved(self, done) -> None:
        """A background save ended (on the cache's save thread)."""
        if done.exception() is not None:
            self._dirty = True  # try again at the next drain
            logger.error("LOOKAHEAD: could not save the trie to %s: %s", self.args.path, done.exception())
        else:
            self._save_seconds = done.result()  # keeps the SAVE_DUTY rate limit
            logger.info("LOOKAHEAD: saved the trie to %s", self.args.path)

    def lookahead_stats(self) -> dict:
        """Steps by path, acceptance and trie size (for benchmarks and metrics)."""
        return {**self.stats.snapshot(), "trie": self.cache.stats(), **self.share.stats_entry(),
                "calibration": {kind: round(value, 3) for kind, value in self.calibration.items()}}
