"""The verify step's shapes: trees packed to a width, the verify input SGLang
sees, and the width tiers (and CUDA graphs) that serve them.

They make sense only together: ``pack_drafts`` lays drafts out at the width
``WidthPlan`` picks, ``LookaheadVerifyInput`` carries that tree through
SGLang's NGRAM verify flow, and ``VerifyTiers`` holds an attention backend
and graph runner per width.

**Packing.** SGLang's TARGET_VERIFY forward takes every request at the same
width ``W``: node 0 is the request's last accepted token (the root), nodes
1..W-1 are draft tokens in topological order, and an ancestor mask
``mask[b, i, j] = 1`` iff node ``j`` is node ``i`` or one of its ancestors
(the layout NGRAM's corpus produces, which ``reconstruct_indices_from_tree_mask``
turns into positions and retrieve indices). Two choices keep padding cheap:

* the width is chosen per step as ``1 + the longest draft in the batch``
  (capped at ``--speculative-num-draft-tokens``), so a step whose drafts are
  short does not pay for the full width;
* short drafts are padded with token 0 hanging off the root (or, when every
  draft is a chain, off the end of the chain, so the whole batch stays a
  chain and the attention backend can use plain causal masking).  A padding
  node is verified like any other: if the target happens to predict its
  token, accepting it is still exactly what plain decoding would emit.

The packing is pure numpy on purpose: it runs on the host between forward
passes and is unit-tested without a model. ``full_verify_mask`` is the one
device-side piece: the mask layout GPU backends take, built on the device.

**The verify input** is NGRAM's ``NgramVerifyInput`` (the same tree layout,
mask and KV handling) with two additions:

* ``is_chain``: a batch whose trees are all single chains says so through
  ``tree_topk == 1``, so attention backends and the greedy verify kernel take
  their causal fast paths (intel_amx skips the tree mask);
* ``penalty_inputs``: the host-side tree and the committed tokens the
  penalizers have not counted yet, for ``lookahead.plugin.penalties``; set
  only in batches that use penalties.

**Widths and tiers.** Every decode step of a LOOKAHEAD server is a
TARGET_VERIFY forward. Its width (tokens per request, the last committed
token included) is:

* ``--speculative-num-draft-tokens`` N while the batch has at most
  ``--speculative-lookahead-max-batch-size`` B requests;
* 1 above B, or when nothing was drafted: the root alone, which is a plain
  decode step on the verify path, so logprobs, grammar and the scheduler's
  bookkeeping never change shape.

On CPU the width of a speculating step is free: 1 + the longest draft of the
batch, since the CPU backend reads it per batch and padding costs compute.

On a GPU every width has its tier: an attention backend built for that
width (FlashAttention-3 sizes its verify metadata from the static width, so
a backend serves one width only) and, unless graphs are disabled, SGLang's
own ``DecodeCudaGraphRunner`` captured at that width, the way
``eagle_worker_v2.py`` builds its adaptive step tiers:

* width 1 at every batch size of the server's decode-graph list: SGLang's
  startup capture, which ``install_startup_width`` makes capture at width 1;
* width N at batch sizes 1..B only: ``VerifyTiers.build``.

``VerifyTiers.activate`` swaps the model runner's attention backend and
graph runner before each forward; the runner's own ``can_run_graph`` then
replays or runs eagerly.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from sglang.srt.speculative.ngram_info import NgramVerifyInput

logger = logging.getLogger(__name__)

PAD_TOKEN = 0


@dataclass
class VerifyTrees:
    tokens: np.ndarray  # int64 [bs * width]: root then drafts, per request
    mask: np.ndarray  # bool [bs * width * width]: ancestor-or-self mask, per request
    width: int
    is_chain: bool  # every request's tree is a single chain
    draft_lens: list  # real (unpadded) draft tokens per request


def verify_width(drafts: Sequence, max_width: int) -> int:
    """1 + the longest draft, capped at ``max_width`` (the configured width)."""
    longest = max((len(d.tokens) for d in drafts), default=0)
    return max(1, min(max_width, 1 + longest))


def _is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def pack_drafts(drafts: Sequence, roots: Sequence[int], width: int) -> VerifyTrees:
    """Pack ``drafts`` (objects with ``tokens`` and ``parents``, parents[i] == -1
    meaning the root) below their ``roots`` into width-``width`` trees.
    Drafts longer than ``width - 1`` are cut to their first ``width - 1``
    nodes, which is still a tree since parents precede children."""
    bs = len(drafts)
    if len(roots) != bs:
        raise ValueError(f"{bs} drafts but {len(roots)} roots")
    if width < 1:
        raise ValueError(f"verify width must be >= 1, got {width}")
    if width == 1:
        # The fallback tier's tree: the root alone. Every step above the max
        # batch size takes this, so it skips the general layout.
        return VerifyTrees(np.asarray(roots, dtype=np.int64), np.ones(bs, dtype=bool), 1, True, [0] * bs)
    tokens = np.full((bs, width), PAD_TOKEN, dtype=np.int64)
    parent = np.zeros((bs, width), dtype=np.int64)
    chain = all(_is_chain(d.parents[: width - 1]) for d in drafts)
    draft_lens = []
    for b, (draft, root) in enumerate(zip(drafts, roots)):
        n = min(len(draft.tokens), width - 1)
        draft_lens.append(n)
        tokens[b, 0] = root
        if n:
            tokens[b, 1 : n + 1] = draft.tokens[:n]
            parent[b, 1 : n + 1] = np.asarray(draft.parents[:n], dtype=np.int64) + 1
        if chain:
            # Padding continues the chain: node i hangs off node i - 1.
            parent[b, n + 1 :] = np.arange(n, width - 1)
        # else padding hangs off the root (parent 0), as initialised.
    return VerifyTrees(tokens.reshape(-1), ancestor_mask(parent).reshape(-1), width, chain, draft_lens)


def ancestor_mask(parent: np.ndarray) -> np.ndarray:
    """[bs, W] parent indices (node 0 is the root) -> [bs, W, W] bool mask of
    ancestors-or-self.  Parents precede children, so one pass suffices."""
    bs, width = parent.shape
    mask = np.zeros((bs, width, width), dtype=bool)
    rows = np.arange(bs)
    mask[:, 0, 0] = True
    for i in range(1, width):
        mask[:, i, :] = mask[rows, parent[:, i], :]
        mask[:, i, i] = True
    return mask


def full_verify_mask(tree_mask: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int, width: int,
                     buffer: torch.Tensor) -> torch.Tensor:
    """The verify mask of SGLang's GPU backends, built on ``tree_mask``'s device.

    Per request and per tree row: ``seq_len`` ones (the committed prefix),
    then the row of its ``[W, W]`` tree mask; all requests flattened in
    order. ``buffer`` (bool, at least ``width * (seq_lens_sum + bs * width)``
    long) holds the result, so that a step allocates nothing and the host
    does no work that grows with the context.
    """
    bs = seq_lens.numel()
    total = width * (seq_lens_sum + bs * width)
    out = buffer[:total]
    out.fill_(True)
    lens = seq_lens.to(torch.int64)
    row = lens + width  # each row: prefix then tree
    start = torch.cumsum(width * row, dim=0) - width * row
    cols = torch.arange(width, device=out.device)
    index = (start.view(-1, 1, 1) + cols.view(1, -1, 1) * row.view(-1, 1, 1)
             + lens.view(-1, 1, 1) + cols.view(1, 1, -1))
    out[index.reshape(-1)] = tree_mask.reshape(-1)
    return out


# retire when: NgramVerifyInput says whether its trees are chains, and
# per-path penalties are upstream (docs/upstream.md).
class LookaheadVerifyInput(NgramVerifyInput):
    def __init__(self, *args, is_chain: bool = False, penalty_inputs: Optional[tuple] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.is_chain = is_chain
        self.penalty_inputs = penalty_inputs  # (tree tokens, tree mask, uncounted tokens per request)

    @property
    def tree_topk(self) -> int:
        return 1 if self.is_chain else -1


def capture_verify_input(custom_mask, width: int) -> LookaheadVerifyInput:
    """The shape-only verify input that graph capture and warm-up forwards run
    with, as SGLang builds it for NGRAM."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    spec_info = LookaheadVerifyInput(
        draft_token=None,
        custom_mask=custom_mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        draft_token_num=width,
    )
    spec_info.capture_hidden_mode = CaptureHiddenMode.NULL
    return spec_info


FALLBACK_WIDTH = 1


@dataclass(frozen=True)
class WidthPlan:
    """Which width a decode step verifies at: pure policy, no SGLang state."""

    num_draft_tokens: int  # N, the widest verify (root included)
    max_batch_size: int  # B: speculate at batch sizes 1..B
    free_width: bool  # the backend takes any width per batch (CPU): no padding to N

    def speculates(self, batch_size: int) -> bool:
        return self.num_draft_tokens > 1 and 0 < batch_size <= self.max_batch_size

    def width(self, batch_size: int, longest_draft: int) -> int:
        """The step's verify width, given the longest draft of the batch: the
        root alone when nothing was drafted (the width-1 tier has graphs at
        every batch size, and is the cheaper forward)."""
        if not self.speculates(batch_size) or longest_draft <= 0:
            return FALLBACK_WIDTH
        if self.free_width:
            return max(FALLBACK_WIDTH, min(self.num_draft_tokens, 1 + longest_draft))
        return self.num_draft_tokens

    @property
    def widths(self) -> tuple:
        """Every width a step may take when widths are not free."""
        return tuple(sorted({FALLBACK_WIDTH, self.num_draft_tokens if self.max_batch_size else 1}))

    def graph_batch_sizes(self, width: int, server_batch_sizes) -> list:
        """The batch sizes captured at ``width``: N at 1..B, 1 at the server's list."""
        if width == FALLBACK_WIDTH:
            return list(server_batch_sizes)
        return list(range(1, self.max_batch_size + 1))


@contextlib.contextmanager
def width_override(width: int, batch_sizes: Optional[list] = None, source: str = "lookahead.verify_tier"):
    """The process's spec (and decode-graph batch sizes) as one tier sees them,
    while its attention backend and graphs are built; restored after."""
    from sglang.srt.model_executor.cuda_graph_config import Phase, with_phase
    from sglang.srt.runtime_context import get_context, get_exec, get_spec

    spec = get_spec()
    saved = {
        "speculative_num_draft_tokens": spec.speculative_num_draft_tokens,
        "speculative_eagle_topk": spec.speculative_eagle_topk,
        "speculative_num_steps": spec.speculative_num_steps,
    }
    fields = {"speculative_num_draft_tokens": width}
    if width == FALLBACK_WIDTH:
        # A single node is a chain: backends that branch on topk see one.
        fields.update(speculative_eagle_topk=1, speculative_num_steps=1)
    graph_config = get_exec().graph.cuda_graph_config
    if batch_sizes is not None and graph_config is not None:
        saved["cuda_graph_config"] = graph_config
        fields["cuda_graph_config"] = with_phase(graph_config, Phase.DECODE, bs=list(batch_sizes),
                                                 max_bs=max(batch_sizes))
    get_context().override(source, **fields)
    try:
        yield
    finally:
        get_context().override(source + ".restore", **saved)


class VerifyTiers:
    """One (attention backend, decode graph runner) per verify width, on a GPU."""

    def __init__(self, plan: WidthPlan, model_runner):
        self.plan = plan
        self.model_runner = model_runner
        self.tiers: dict[int, tuple] = {}
        self.active: Optional[int] = None

    @property
    def uses_graphs(self) -> bool:
        return any(runner is not None for _, runner in self.tiers.values())

    def adopt_startup(self, width: int) -> None:
        """The model runner's current backend and graphs serve ``width``."""
        mr = self.model_runner
        self.tiers[width] = (mr.attn_backend, getattr(mr, "decode_cuda_graph_runner", None))
        self.active = width

    def build(self, width: int, attn_backend, capture: bool) -> None:
        """Add the tier of ``width`` around ``attn_backend`` (built for that width),
        capturing its graphs at the plan's batch sizes when ``capture``."""
        mr = self.model_runner
        runner = None
        if capture and self.plan.max_batch_size > 0:
            sizes = self.plan.graph_batch_sizes(width, ())
            tic = time.perf_counter()
            with width_override(width, sizes):
                runner = mr._decode_cuda_graph_runner_cls()(
                    mr, attn_backend=attn_backend, speculative_num_draft_tokens=width)
            logger.info("LOOKAHEAD: captured width-%d verify graphs for batch sizes %s in %.1f s",
                        width, sizes, time.perf_counter() - tic)
        self.tiers[width] = (attn_backend, runner)

    def activate(self, width: int) -> None:
        if width == self.active:
            return
        backend, runner = self.tiers[width]
        self.model_runner.attn_backend = backend
        self.model_runner.decode_cuda_graph_runner = runner
        self.active = width


def build_attn_backend(model_runner, width: int):
    """A fresh attention backend (own workspace) sized for verify width ``width``."""
    backup = model_runner.init_new_workspace
    try:
        with width_override(width):
            return model_runner._get_attention_backend(init_new_workspace=True)
    finally:
        model_runner.init_new_workspace = backup
