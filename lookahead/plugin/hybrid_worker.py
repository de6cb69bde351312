"""``LookaheadHybridWorker``: SGLang's EAGLE worker, drafting from LOOKAHEAD's trie too.

``--speculative-algorithm EAGLE`` (or ``EAGLE3``) with
``--speculative-lookahead-hybrid``: the algorithm stays EAGLE, so everything
SGLang keys on that name (the draft model and its KV pool, draft-extend,
CUDA graphs, overlap relay, adaptive steps, metrics) is EAGLE's own. This
subclass of ``EAGLEWorkerV2`` changes one thing: the tree each request
verifies.

Per decode step (``forward_batch_generation``):

1. the trie is fed as LOOKAHEAD feeds it (``lookahead.plugin.request_feed``: prompts
   whole at prefill, outputs as they are committed, per isolation scope) and
   drafts every request, chains at ``--speculative-eagle-topk 1``, trees
   above;
2. ``lookahead.plugin.hybrid.HybridPolicy`` values both drafters' nodes from
   measured acceptance; when EAGLE's tree cannot change any request's choice,
   EAGLE's draft model steps are skipped;
3. EAGLE's ``draft()`` (its own draft worker, called through the hook below)
   drafts otherwise, and each request verifies the best nodes of both trees
   within the verify width (``HybridVerifyInput``, an ``EagleVerifyInput``);
   when every request takes EAGLE's own tree, EAGLE's verify input is used
   as it is;
4. EAGLE's verify and draft-extend run unchanged: the draft model's KV and
   hidden state are rebuilt over the accepted tokens whatever tree they came
   from, so a skipped draft step leaves nothing stale behind;
5. both trees are scored against the committed tokens at the next step, which
   is what the policy's estimates are measured from.

The tree of a step keeps the shape class the server's EAGLE configuration
declares (chains at top-k 1, which attention backends verify causally), its
verify width (``--speculative-num-draft-tokens``), and its node 0 (EAGLE's
bonus token), so the verify and KV paths see nothing they do not already
handle.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_func
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.runtime_context import get_parallel, get_schedule
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.srt.speculative.eagle_utils import TreeMaskMode
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from lookahead.plugin import hooks as sglang_hooks
from lookahead.trie.cache import LookaheadCache
from lookahead.plugin.hybrid import EMPTY, HybridPolicy, tree_from_links
from lookahead.plugin.stats import HybridStats
from lookahead.plugin.request_feed import RequestFeed
from lookahead.plugin.server_args import get_hybrid_args
from lookahead.plugin.verify import PAD_TOKEN, ancestor_mask, full_verify_mask

logger = logging.getLogger(__name__)


@dataclass
class HybridVerifyInput(EagleVerifyInput):
    """EAGLE's verify input for a tree that is not (only) EAGLE's: any shape
    within the verify width. ``spec_steps`` is the deepest node's depth;
    ``is_chain``: every request's tree is a chain."""

    is_chain: bool = False

    @property
    def tree_topk(self) -> int:
        # 1: chains, verified causally; -1: an irregular tree (the mask is read).
        return 1 if self.is_chain else -1


class _Committed:
    """The tokens one forward committed per request, read from its result
    tensors when first needed (under overlap, one step later)."""

    def __init__(self, next_token_ids: torch.Tensor, accept_lens: Optional[torch.Tensor], width: int):
        self.next_token_ids, self.accept_lens, self.width = next_token_ids, accept_lens, width
        self._rows = None

    def rows(self) -> list:
        if self._rows is None:
            ids = self.next_token_ids.tolist()
            if self.accept_lens is None:  # a prefill: one token per request
                self._rows = [[t] for t in ids]
            else:
                w = self.width
                self._rows = [ids[i * w: i * w + n] for i, n in enumerate(self.accept_lens.tolist())]
        return self._rows


@dataclass
class _Step:
    """One decode step's drafts and choices, kept until its tokens are known."""

    rids: list
    base_lens: list  # committed output length of each request before the step
    trie: list  # per request: Tree (values) of the trie's draft
    trie_expected: list  # per request: the trie's own estimate
    skip_eagle: bool
    eagle: list = field(default_factory=list)  # per request: Tree or None
    sources: list = field(default_factory=list)
    passthrough: bool = False
    width: int = 0
    committed: Optional[_Committed] = None  # per request: its accepted tokens then the bonus token


# retire when: EAGLE's worker accepts a pluggable extra draft source (docs/upstream.md).
class LookaheadHybridWorker(EAGLEWorkerV2):
    def __init__(self, server_args: ServerArgs, gpu_id: int, nccl_port: int, target_worker: TpModelWorker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.args = get_hybrid_args(server_args)
        self.enable_overlap = not get_schedule().disable_overlap_schedule
        self.tp_size = get_parallel().tp_size
        self.chains = self.topk == 1
        self.policy = HybridPolicy(self.speculative_num_draft_tokens, chains=self.chains)
        self.stats = HybridStats()
        if getattr(server_args, "enable_metrics", False):
            from lookahead.plugin.stats import HybridMetrics

            self.stats.listeners.append(HybridMetrics({
                "model_name": server_args.served_model_name or server_args.model_path,
                "tp_rank": str(get_parallel().tp_rank)}))
        overrides = self.args.cache_overrides()
        vocab = getattr(target_worker.model_runner.model_config, "vocab_size", None)
        if vocab:
            overrides["vocab_size"] = int(vocab)
        self.cache = LookaheadCache(**overrides)
        self.max_match_len = self.cache.config.max_match_len
        self.feed = RequestFeed(self.cache, on_finish=self._forget, isolation=self.args.isolation)
        self._step: Optional[_Step] = None  # the decode step being run
        self._last: Optional[_Step] = None  # the previous decode step, until its tokens are scored
        # Under overlap scheduling, per request: the last forward's committed
        # tokens (a _Committed and the request's row) and its output length
        # before them; they reach output_ids one step late.
        self._unseen: dict = {}
        self._sources = collections.deque()  # per decode step awaiting its acceptance: sources
        sglang_hooks.install_hybrid()
        if self._draft_worker is not None:
            # EAGLE's draft() of this worker's own draft worker: the one call
            # the hybrid decides around (skip it, or merge its tree).
            # retire when: EAGLE's worker exposes an extension point between
            # drafting and verification (a pluggable draft source).
            self._eagle_draft = self._draft_worker.draft
            self._draft_worker.draft = self._draft
        logger.info(
            "LOOKAHEAD+EAGLE: verify width %d, %s, EAGLE %d steps x top-%d; trie %s, isolation %s",
            self.speculative_num_draft_tokens, "chains" if self.chains else "trees",
            self.speculative_num_steps, self.topk, self.cache.config, self.args.isolation)

    # -- SGLang worker interface ----------------------------------------------------

    def forward_batch_generation(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None,
                                 pp_proxy_tensors=None):
        self.feed.sweep()
        self._step = None
        decode = batch.forward_mode.is_decode() and bool(batch.reqs)  # verify changes forward_mode
        if batch.forward_mode.is_extend():
            self.feed.start(batch.reqs)
        elif (decode and self._draft_worker is not None
              and not batch.is_extend_in_batch and self.speculative_num_steps > 0
              and not (batch.spec_info is not None and batch.spec_info.is_verify_input())):
            t0 = time.perf_counter()
            self._step = self._plan(batch)
            self.stats.record_host(time.perf_counter() - t0)
        extend = batch.forward_mode.is_extend()
        bases = [len(r.output_ids) for r in batch.reqs] if extend and self.enable_overlap else None
        result = super().forward_batch_generation(batch, on_publish=on_publish, grammar_barrier=grammar_barrier,
                                                  pp_proxy_tensors=pp_proxy_tensors)
        if decode:
            self._finish(batch, result)
        elif bases is not None and result.next_token_ids is not None:
            committed = _Committed(result.next_token_ids, None, 1)
            for i, req in enumerate(batch.reqs):
                self._unseen[req.rid] = (committed, i, bases[i])
        return result

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list, batch_size: int = 0) -> None:
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)
        if self._sources:
            sources = self._sources.popleft()  # results arrive in step order
            if sources is not None and len(sources) == len(num_correct_drafts_per_req):
                self.stats.record_accept(sources, num_correct_drafts_per_req)

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        super().note_request_finished(rid=rid, natural_stop=natural_stop)
        self.feed.finish(rid)

    def clear_cache_pool(self):
        super().clear_cache_pool()
        self.feed.finish_all()
        self._last = None
        self._unseen.clear()

    def _forget(self, rid) -> None:
        self._unseen.pop(rid, None)

    def lookahead_hybrid_stats(self) -> dict:
        """Steps and acceptance by draft source, the policy's estimates, the trie's size."""
        return {**self.stats.snapshot(self.policy), "trie": self.cache.stats()}

    # -- the step ------------------------------------------------------------------------

    def _plan(self, batch: ScheduleBatch) -> _Step:
        """Score the previous step, feed and draft the trie, decide whether EAGLE drafts."""
        width = self.speculative_num_draft_tokens
        if width != self.policy.width:
            self.policy.resize(width)
        pending = self._pending(batch)
        self._score_last()
        reqs = self.feed.sync(batch.reqs, pending)
        bs = len(batch.reqs)
        rids = [r.rid for r in batch.reqs]
        base = [len(r.output_ids) + (len(pending[i]) if pending is not None else 0) for i, r in enumerate(batch.reqs)]
        trie, expected = [EMPTY] * bs, [0.0] * bs
        if len(reqs) == bs and width > 1:
            if self.tp_size > 1:
                self.cache.synchronize()  # identical drafts on every rank
            contexts = [RequestFeed.context_of(r, pending[i] if pending is not None else (), self.max_match_len)
                        for i, r in enumerate(batch.reqs)]
            t0 = time.perf_counter()
            drafts = self.cache.batch_draft(rids, contexts, width - 1, self.chains)
            self.stats.record_trie(time.perf_counter() - t0)
            trie = [self.policy.trie_tree(d.tokens, d.parents, d.expected) for d in drafts]
            expected = [d.expected for d in drafts]
        skip = all(self.policy.trie_suffices(t) for t in trie)
        return _Step(rids, base, trie, expected, skip, width=width)

    def _pending(self, batch: ScheduleBatch) -> Optional[list]:
        """Under overlap scheduling, per request the committed tokens that are
        not in ``output_ids`` yet: the last forward's (a decode step's accepted
        tokens, or the prefill's first token), which the scheduler processes
        one step late (grammar batches in time)."""
        if not self.enable_overlap:
            return None
        out = []
        for req in batch.reqs:
            unseen = self._unseen.get(req.rid)
            late = unseen is not None and len(req.output_ids) == unseen[2]
            out.append(unseen[0].rows()[unseen[1]] if late else [])
        return out

    def _draft(self, batch: ScheduleBatch, *, with_topology: bool = False):
        """EAGLE's ``draft()``, skipped or merged with the trie's drafts."""
        step = self._step
        if step is None or with_topology:
            return self._eagle_draft(batch, with_topology=with_topology)
        eagle_input, scores = None, None
        if not step.skip_eagle:
            sglang_hooks.take_eagle_scores()
            eagle_input = self._eagle_draft(batch)
            scores = sglang_hooks.take_eagle_scores()
        t0 = time.perf_counter()
        try:
            return self._choose(batch, step, eagle_input, scores)
        finally:
            self.stats.record_host(time.perf_counter() - t0)

    def _choose(self, batch: ScheduleBatch, step: _Step, eagle_input, scores):
        """Each request's tree, and the verify input that carries them."""
        bs = len(step.rids)
        if eagle_input is not None:
            step.eagle = self._eagle_trees(eagle_input, bs, step.width, scores)
        else:
            step.eagle = [None] * bs
        choices = [self.policy.choose(t, e) for t, e in zip(step.trie, step.eagle)]
        step.sources = [c.source for c in choices]
        if eagle_input is not None and all(c.unchanged_eagle for c in choices):
            step.passthrough = True
            return eagle_input
        return self._verify_input(batch, choices, eagle_input, step.width)

    def _eagle_trees(self, verify_input: EagleVerifyInput, bs: int, width: int, scores) -> list:
        """EAGLE's trees on the host, with their nodes' values."""
        tokens = verify_input.draft_token.view(bs, width).tolist()
        first = verify_input.retrieve_next_token.view(bs, width).tolist()
        sibling = verify_input.retrieve_next_sibling.view(bs, width).tolist()
        score_rows = scores.tolist() if scores is not None else None
        trees = []
        for b in range(bs):
            nodes, pars = tree_from_links(first[b], sibling[b])
            toks = [tokens[b][i] for i in nodes]
            raw = [score_rows[b][i - 1] for i in nodes] if score_rows is not None else None
            trees.append(self.policy.eagle_tree(toks, pars, raw))
        return trees

    def _verify_input(self, batch: ScheduleBatch, choices: list, eagle_input, width: int) -> HybridVerifyInput:
        """The chosen trees as EAGLE's verify input (node 0: EAGLE's bonus token)."""
        bs = len(choices)
        tokens = np.full((bs, width), PAD_TOKEN, dtype=np.int64)
        parent = np.zeros((bs, width), dtype=np.int64)
        for b, c in enumerate(choices):
            n = min(len(c.tokens), width - 1)
            if n:
                tokens[b, 1:n + 1] = c.tokens[:n]
                parent[b, 1:n + 1] = np.asarray(c.parents[:n], dtype=np.int64) + 1
            if self.chains:
                parent[b, n + 1:] = np.arange(n, width - 1)  # padding continues the chain
        mask = ancestor_mask(parent)
        is_chain = bool((parent[:, 1:] == np.arange(width - 1)).all())
        depth = int(mask.sum(-1).max()) - 1

        device = batch.seq_lens.device
        draft_token = torch.from_numpy(tokens).to(device)
        draft_token[:, 0] = batch.spec_info.bonus_tokens.to(draft_token.dtype)
        tree_mask = torch.from_numpy(mask.reshape(-1)).to(device)
        positions = torch.empty((bs * width,), dtype=torch.int64, device=device)
        links = torch.full((3, bs, width), -1, dtype=torch.int64, device=device)
        retrieve_index, retrieve_next_token, retrieve_next_sibling = links
        reconstruct_indices_from_tree_mask_func(tree_mask, batch.seq_lens, positions, retrieve_index,
                                                retrieve_next_token, retrieve_next_sibling, bs, width)
        return HybridVerifyInput(
            draft_token=draft_token.flatten(),
            custom_mask=self._custom_mask(batch, tree_mask, bs, width),
            positions=positions,
            retrieve_index=retrieve_index,
            retrieve_next_token=retrieve_next_token,
            retrieve_next_sibling=retrieve_next_sibling,
            retrieve_cum_len=None,
            spec_steps=depth,
            topk=self.topk,
            draft_token_num=width,
            capture_hidden_mode=None,
            seq_lens_sum=None,
            seq_lens_cpu=None,
            # The verify window's KV slots do not depend on the tree: keep what
            # EAGLE's draft planned for it.
            prepared_out_cache_loc=getattr(eagle_input, "prepared_out_cache_loc", None),
            kv_loc_plan=getattr(eagle_input, "kv_loc_plan", None),
            is_chain=is_chain,
        )

    def _custom_mask(self, batch: ScheduleBatch, tree_mask: torch.Tensor, bs: int, width: int) -> torch.Tensor:
        """The tree mask in the layout the target's attention backend reads, in
        its own buffer where it has one (as EAGLE's ``build_tree_kernel_efficient``
        writes it)."""
        backend = self._target_worker.model_runner.attn_backend
        verify_mask = backend.verify_mask
        mode = verify_mask.mode if verify_mask is not None else self._draft_worker.tree_mask_mode
        buffer = verify_mask.buffer if verify_mask is not None and verify_mask.fits(bs) else None
        if mode == TreeMaskMode.QLEN_ONLY:
            if buffer is None:
                return tree_mask
            out = buffer[: tree_mask.numel()]
            out.copy_(tree_mask)
            return out
        if mode == TreeMaskMode.FULL_MASK:
            if batch.seq_lens_cpu is not None:
                seq_lens_sum = int(batch.seq_lens_cpu.sum())
            else:
                seq_lens_sum = int(batch.seq_lens.sum())
            needed = width * (seq_lens_sum + bs * width)
            if buffer is None or buffer.numel() < needed or buffer.dtype != torch.bool:
                out = full_verify_mask(tree_mask, batch.seq_lens, seq_lens_sum, width,
                                       torch.empty((needed,), dtype=torch.bool, device=tree_mask.device))
                if buffer is not None and buffer.numel() >= needed:
                    buffer[:needed].copy_(out)
                    return buffer[:needed]
                return out
            return full_verify_mask(tree_mask, batch.seq_lens, seq_lens_sum, width, buffer)
        raise NotImplementedError(f"LOOKAHEAD+EAGLE: verify mask mode {mode!r} is not supported")

    def _finish(self, batch: ScheduleBatch, result) -> None:
        step = self._step
        self._step = None
        if step is None:
            self._sources.append(None)
            return
        step.committed = _Committed(result.next_token_ids, result.accept_lens, step.width)
        if self.enable_overlap:
            for i, rid in enumerate(step.rids):
                self._unseen[rid] = (step.committed, i, step.base_lens[i])
        self._last = step
        self._sources.append(step.sources)
        self.stats.record_step(step.sources, not step.skip_eagle, step.passthrough)
        self.stats.maybe_log(self.policy)

    def _score_last(self) -> None:
        """Score the previous step's trees (both drafters') against its committed tokens."""
        last, self._last = self._last, None
        if last is None or last.committed is None or not last.sources:
            return
        for i, committed in enumerate(last.committed.rows()):
            if not committed:
                continue
            self.policy.observe(committed, last.trie[i], last.trie_expected[i], last.eagle[i] if last.eagle else None)
