"""``LookaheadWorker``: SGLang's speculative worker for LOOKAHEAD.

The verify flow is NGRAM's (``sglang/srt/speculative/ngram_worker.py``),
reused rather than rewritten: the drafts become an ``NgramVerifyInput`` tree,
the target runs one TARGET_VERIFY forward, ``eagle_sample`` accepts the
longest matching path (greedy or by tree speculative sampling) and
``move_accept_tokens_to_target_kvcache`` compacts the KV.  What differs, and
lives in its own module:

* drafting: ``lookahead.cache.LookaheadCache`` (the Cython trie), fed by
  ``lookahead.request_feed.RequestFeed``;
* tree layout: ``lookahead.verify_tree`` (variable width, cheap padding);
* the CUDA-graph runner's knowledge of LOOKAHEAD: ``lookahead.sglang_hooks``;
* a plain one-token DECODE step, with no drafting cost, when the batch is
  larger than ``--speculative-lookahead-max-batch-size`` or nothing matched;
* sampling verification on CPU, where SGLang only verifies greedily:
  ``lookahead.cpu_sampling``;
* counters and logs: ``lookahead.worker_stats``, Prometheus metrics:
  ``lookahead.metrics``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Optional

import numpy as np
import torch

from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_func
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_device, get_parallel
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.eagle_utils import eagle_sample
from sglang.srt.speculative.ngram_info import NgramVerifyInput
from sglang.srt.speculative.spec_utils import (
    commit_mamba_states_after_verify,
    move_accept_tokens_to_target_kvcache,
    prepare_mamba_track_for_verify,
)
from sglang.srt.utils import is_cpu

from lookahead.cache import Draft, LookaheadCache
from lookahead.request_feed import RequestFeed
from lookahead.server_args import get_lookahead_args
from lookahead.verify_tree import pack_drafts, verify_width
from lookahead.worker_stats import StepStats

logger = logging.getLogger(__name__)

_is_cpu = is_cpu()

# With --speculative-lookahead-path, the trie is saved whenever the server
# drains, unless the last save was less than this many of its own durations
# ago (so saving takes at most ~1/SAVE_DUTY of the time), and at exit when the
# process exits normally.
SAVE_DUTY = 10.0


class LookaheadVerifyInput(NgramVerifyInput):
    """An NGRAM verify tree that says when it is a plain chain, so attention
    backends can skip the tree mask (intel_amx does for ``tree_topk == 1``)."""

    def __init__(self, *args, is_chain: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.is_chain = is_chain

    @property
    def tree_topk(self) -> int:
        return 1 if self.is_chain else -1


class LookaheadWorker(BaseSpecWorker):
    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int,
        nccl_port: int,
        target_worker: TpModelWorker,
    ):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = get_device().device
        self.args = get_lookahead_args(server_args)
        self.num_draft_tokens = self.args.num_draft_tokens  # verify width, root included
        self.tp_size = get_parallel().tp_size
        # With CUDA graphs, SGLang captures verify graphs at the full width:
        # every verify step then uses that width so that it replays one.
        self.use_graphs = not _is_cpu and not getattr(server_args, "disable_cuda_graph", False)
        from lookahead import sglang_hooks

        sglang_hooks.install()  # before the scheduler captures any graph
        self.cache = self._load_cache()
        self.feed = RequestFeed(self.cache, on_finish=self._finished)
        self.stats = StepStats()
        if getattr(server_args, "enable_metrics", False):
            from lookahead.metrics import LookaheadMetrics

            labels = {"model_name": server_args.served_model_name or server_args.model_path,
                      "tp_rank": str(get_parallel().tp_rank)}
            self.stats.listeners.append(LookaheadMetrics(labels, self.cache.stats))
        self._dirty = False
        self._last_save = float("-inf")
        self._save_seconds = 0.0
        self._save_lock = threading.Lock()
        if self.args.path:
            atexit.register(self.save_trie)
        logger.info(
            "LOOKAHEAD worker: verify width %d (%s), speculating at batch sizes 1..%d, trie %s",
            self.num_draft_tokens, "one branch" if self.args.one_branch else "tree",
            self.args.max_batch_size, self.cache.config,
        )

    # -- SGLang worker interface ------------------------------------------------

    @property
    def draft_worker(self):
        return None  # drafts come from the host-side trie

    def alloc_memory_pool(self, **kwargs):
        # The target's pools are shared (no draft model, no draft KV).
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()

    def clear_cache_pool(self):
        # Called when the scheduler flushes its caches while idle: no request
        # is live any more. The shared history is kept: it is about text, not
        # about the KV cache that was flushed.
        self.feed.finish_all()

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list, batch_size: int = 0) -> None:
        self.stats.record_accept(num_correct_drafts_per_req)

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        self.feed.finish(rid)

    def forward_batch_generation(self, batch: ScheduleBatch, on_publish=None, pp_proxy_tensors=None):
        self.feed.sweep()
        if batch.forward_mode.is_decode():
            bs = len(batch.reqs)
            if not self.args.speculates(bs):
                # No drafting cost at all: outputs reach the trie when
                # speculation resumes, or when the request ends.
                result = self._decode(batch, pp_proxy_tensors, "fallback")
            else:
                reqs = self.feed.sync(batch.reqs)
                drafts = self._draft(batch, reqs)
                if drafts is not None:
                    result = self._verify(batch, drafts, pp_proxy_tensors, "verify")
                elif self.use_graphs and len(reqs) == bs:
                    # Replaying the captured verify graph beats an eager decode.
                    result = self._verify(batch, [Draft([], [])] * bs, pp_proxy_tensors, "no_draft")
                else:
                    result = self._decode(batch, pp_proxy_tensors, "no_draft")
            self.stats.maybe_log(self.cache.stats)
        else:
            if batch.forward_mode.is_extend():
                self.feed.start(batch.reqs)
            result = self._extend(batch, pp_proxy_tensors)
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        return result

    # -- drafting ----------------------------------------------------------------

    def _draft(self, batch: ScheduleBatch, reqs: list) -> Optional[list]:
        """One draft per request of the batch, or None when all are empty."""
        if len(reqs) != len(batch.reqs):
            return None  # a request unknown to the trie: verify nothing this step
        if self.tp_size > 1:
            # Every rank must verify the same tree: with every insert applied,
            # identical calls give identical drafts on every rank.
            self.cache.synchronize()
        tail = self.cache.config.max_match_len
        contexts = []
        for req in reqs:
            out = req.output_ids
            if len(out) >= tail:
                contexts.append(out[-tail:])
            else:
                contexts.append(list(RequestFeed.prompt_of(req)[-(tail - len(out)):]) + list(out))
        t0 = time.perf_counter()
        drafts = self.cache.batch_draft([r.rid for r in reqs], contexts, self.num_draft_tokens - 1,
                                        self.args.one_branch)
        drafted = sum(len(d) for d in drafts)
        self.stats.record_draft(time.perf_counter() - t0, drafted, len(reqs))
        return drafts if drafted else None

    # -- the three kinds of step -------------------------------------------------------

    def _verify(self, batch: ScheduleBatch, drafts: list, pp_proxy_tensors, reason: str) -> GenerationBatchResult:
        bs = len(batch.reqs)
        width = self.num_draft_tokens if self.use_graphs else verify_width(drafts, self.num_draft_tokens)
        trees = pack_drafts(drafts, _last_tokens(batch), width)

        draft_tokens = torch.from_numpy(trees.tokens).to(self.device, non_blocking=True)
        tree_mask = torch.from_numpy(trees.mask).to(self.device, non_blocking=True)
        positions = torch.empty((bs * width,), dtype=torch.int64, device=self.device)
        retrieve_index = torch.empty((bs, width), dtype=torch.int64, device=self.device)
        retrieve_next_token = torch.empty((bs, width), dtype=torch.int64, device=self.device)
        retrieve_next_sibling = torch.empty((bs, width), dtype=torch.int64, device=self.device)
        reconstruct_indices_from_tree_mask_func(
            tree_mask, batch.seq_lens, positions, retrieve_index, retrieve_next_token,
            retrieve_next_sibling, bs, width,
        )
        custom_mask = tree_mask
        if not _is_cpu:
            # GPU backends take the full mask: the committed prefix, then the tree.
            custom_mask = full_verify_mask(trees.mask, batch.seq_lens_cpu, width, self.device)

        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.input_ids = draft_tokens
        batch.out_cache_loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=batch.req_to_token_pool.req_to_token,
            start_offset=batch.seq_lens,
            end_offset=batch.seq_lens + width,
            batch_size=bs,
            draft_token_num=width,
            device=self.device,
        )
        prepare_mamba_track_for_verify(batch)
        verify_input = LookaheadVerifyInput(
            draft_token=draft_tokens,
            custom_mask=custom_mask,
            positions=positions,
            retrieve_index=retrieve_index,
            retrieve_next_token=retrieve_next_token,
            retrieve_next_sibling=retrieve_next_sibling,
            draft_token_num=width,
            is_chain=trees.is_chain,
        )
        batch.spec_info = verify_input

        batch_result = self._target_worker.forward_batch_generation(
            batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True
        )
        logits_output = batch_result.logits_output
        if _is_cpu and not batch.sampling_info.is_all_greedy:
            # SGLang verifies greedily on CPU whatever the sampling settings;
            # ours keeps the target's sampling distribution.
            from lookahead.cpu_sampling import tree_sampling_verify

            predict, accept_lens, accept_index = tree_sampling_verify(verify_input, batch, logits_output)
        else:
            predict, accept_lens, accept_index = eagle_sample(
                verify_input, batch, logits_output, None,
                watermark_state=self.model_runner.watermark_state,
            )
        new_seq_lens = batch.seq_lens + accept_lens
        commit_mamba_states_after_verify(self._target_worker, batch, accept_lens, accept_index, width)
        accept_tokens = predict[accept_index].flatten()
        move_accept_tokens_to_target_kvcache(
            batch, accept_index, accept_lens - 1, self.token_to_kv_pool_allocator
        )
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, predict, accept_index=accept_index)
        batch.forward_mode = ForwardMode.DECODE
        self.stats.record_step(True, bool(batch_result.can_run_cuda_graph), reason)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=accept_tokens,
            can_run_cuda_graph=batch_result.can_run_cuda_graph,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=self._next_draft_input(accept_tokens, accept_lens, new_seq_lens, width),
            speculative_num_draft_tokens=self.num_draft_tokens,
            speculative_output_stride=width,
        )

    def _decode(self, batch: ScheduleBatch, pp_proxy_tensors, reason: str) -> GenerationBatchResult:
        """A plain one-token step inside a speculative server.

        SGLang's speculative decode preparation leaves ``seq_lens`` at the
        committed length and reserves KV slots ahead; a DECODE forward expects
        the new token counted in.  The batch is restored by the scheduler's
        forward isolation afterwards, so it is adjusted in place here.
        """
        bs = len(batch.reqs)
        seq_lens = batch.seq_lens
        batch.input_ids = torch.tensor(_last_tokens(batch), dtype=torch.int64).to(self.device, non_blocking=True)
        # The KV slot reserved for the token at position seq_len.
        batch.out_cache_loc = batch.req_to_token_pool.req_to_token[
            batch.req_pool_indices, seq_lens].to(torch.int64)
        batch.seq_lens = seq_lens + 1
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu + 1
        if getattr(batch, "orig_seq_lens", None) is not None:
            batch.orig_seq_lens = batch.orig_seq_lens + 1
        batch.seq_lens_sum = None
        batch.spec_info = None
        batch.forward_mode = ForwardMode.DECODE
        batch_result = self._target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors)
        self.stats.record_step(False, bool(batch_result.can_run_cuda_graph), reason)
        return self._one_token_result(batch_result, bs, seq_lens + 1)

    def _extend(self, batch: ScheduleBatch, pp_proxy_tensors) -> GenerationBatchResult:
        """Prefill: the target's own forward; drafting starts at the first decode."""
        batch_result = self._target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors)
        return self._one_token_result(batch_result, len(batch.reqs), batch.seq_lens.clone())

    def _one_token_result(self, batch_result, bs: int, new_seq_lens) -> GenerationBatchResult:
        """A step that committed exactly one sampled token per request."""
        predict = batch_result.next_token_ids
        accept_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
        return GenerationBatchResult(
            logits_output=batch_result.logits_output,
            next_token_ids=predict,
            can_run_cuda_graph=batch_result.can_run_cuda_graph,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=self._next_draft_input(predict, accept_lens, new_seq_lens, 1),
            speculative_num_draft_tokens=self.num_draft_tokens,
            speculative_output_stride=1,
        )

    def _next_draft_input(self, tokens, accept_lens, new_seq_lens, stride: int) -> NgramVerifyInput:
        """What the scheduler carries to the next step (filtered and merged with
        other batches); always laid out at the full width so batches merge."""
        bs = accept_lens.shape[0]
        full = torch.zeros((bs, self.num_draft_tokens), dtype=torch.int32, device=self.device)
        full[:, :stride] = tokens.reshape(bs, stride)
        return NgramVerifyInput(
            draft_token_num=self.num_draft_tokens,
            new_seq_lens=new_seq_lens,
            accept_tokens=full.flatten(),
            accept_lens=accept_lens,
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
        path = self.args.path
        if path and os.path.exists(path):
            cache = LookaheadCache.load(path, **overrides)
            logger.info("LOOKAHEAD: loaded %d shared tokens from %s", cache.stats()["shared_tokens"], path)
            return cache
        return LookaheadCache(**overrides)

    def save_trie(self) -> None:
        """Write the shared history to ``--speculative-lookahead-path`` (rank 0)."""
        if not self.args.path or get_parallel().tp_rank != 0 or not self._dirty:
            return
        with self._save_lock:
            try:
                self._last_save = time.monotonic()
                self.cache.save(self.args.path)
                self._save_seconds = time.monotonic() - self._last_save
                self._dirty = False
                logger.info("LOOKAHEAD: saved the trie to %s", self.args.path)
            except Exception:
                logger.exception("LOOKAHEAD: could not save the trie to %s", self.args.path)

    def lookahead_stats(self) -> dict:
        """Steps by path, acceptance and trie size (for benchmarks and metrics)."""
        return {**self.stats.snapshot(), "trie": self.cache.stats()}


def _last_tokens(batch: ScheduleBatch) -> list:
    """Each request's last committed token: the root of its verify tree."""
    return [req.output_ids[-1] if req.output_ids else RequestFeed.prompt_of(req)[-1] for req in batch.reqs]


def full_verify_mask(tree_mask: np.ndarray, seq_lens_cpu, width: int, device) -> torch.Tensor:
    """Per request, ``seq_len`` ones (the committed prefix) then its tree rows,
    flattened: the mask layout SGLang's GPU backends take for NGRAM trees."""
    bs = len(seq_lens_cpu)
    tree = torch.from_numpy(tree_mask.reshape(bs, width, width))
    parts = []
    for i in range(bs):
        prefix = torch.ones((width, int(seq_lens_cpu[i])), dtype=torch.bool)
        parts.append(torch.cat((prefix, tree[i]), dim=1).flatten())
    return torch.cat(parts).to(device, non_blocking=True)
