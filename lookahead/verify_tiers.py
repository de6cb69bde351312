"""Verify widths, and the CUDA-graph tier that serves each of them.

Every decode step of a LOOKAHEAD server is a TARGET_VERIFY forward. Its
width (tokens per request, the last committed token included) is:

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
from typing import Optional

logger = logging.getLogger(__name__)

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
