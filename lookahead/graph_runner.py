"""A dedicated multi-token CUDA-graph runner for LOOKAHEAD's verify step.

At batch sizes 1-4 a decode step on a GPU is dominated by kernel launches
unless it replays a CUDA graph, and a LOOKAHEAD verify step feeds
``1 + drafts`` tokens per request, so it needs graphs of that width.  This
module captures a verify forward once per (batch size, width) bucket with
static input buffers and replays it, padding a smaller batch up to its
bucket:

* ``GraphPlan`` is the policy, pure Python and unit-tested on CPU: which
  buckets exist (batch sizes 1..max, the widths), the smallest bucket for a
  batch, the static buffer sizes, and the route a step takes
  (``verify-graph``, ``decode-graph`` or ``eager``).  It is disabled, and
  nothing is ever captured, on CPU or with ``--disable-cuda-graph``.
* ``VerifyGraphRunner`` does the capture and replay of any verify forward
  ``forward(buffers) -> logits`` over the plan's buckets, sharing one
  memory pool (pass SGLang's graph pool to share it with the decode
  graphs).  The graph mechanism is injectable: on CUDA it is
  ``torch.cuda.CUDAGraph``; the CPU tests use a recorder that re-runs the
  captured call, so padding, bucketing and slicing are tested without a GPU.

Status: the plan and the runner are tested on CPU; capturing SGLang's own
TARGET_VERIFY forward through it (attention-backend metadata for graph
capture and replay) has not been run on a GPU yet, so the worker uses
SGLang's built-in verify graphs (see ``lookahead.sglang_hooks``) until
``scripts/gpu_check.sh`` has validated this runner.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence

import torch

VERIFY_GRAPH, DECODE_GRAPH, EAGER = "verify-graph", "decode-graph", "eager"


@dataclass(frozen=True)
class GraphPlan:
    batch_sizes: tuple = ()  # captured batch-size buckets, ascending
    widths: tuple = ()  # captured verify widths (tokens per request, root included), ascending
    enabled: bool = False
    decode_graph_max_bs: int = 0  # largest batch SGLang's own decode graphs cover (0: none)

    @classmethod
    def for_server(cls, *, device: str, disable_cuda_graph: bool, max_batch_size: int, num_draft_tokens: int,
                   widths: Optional[Sequence[int]] = None, decode_graph_max_bs: int = 0) -> "GraphPlan":
        """The plan for a server: verify graphs for batch sizes 1..max_batch_size
        at the verify width (or the given widths), none on CPU or when graphs
        are disabled."""
        if max_batch_size < 0 or num_draft_tokens < 1:
            raise ValueError("max_batch_size must be >= 0 and num_draft_tokens >= 1")
        enabled = device.startswith("cuda") and not disable_cuda_graph and max_batch_size > 0
        widths = tuple(sorted(set(widths or (num_draft_tokens,))))
        if any(w < 1 or w > num_draft_tokens for w in widths):
            raise ValueError(f"verify widths must be in 1..{num_draft_tokens}, got {widths}")
        return cls(
            batch_sizes=tuple(range(1, max_batch_size + 1)) if enabled else (),
            widths=widths if enabled else (),
            enabled=enabled,
            decode_graph_max_bs=decode_graph_max_bs if not disable_cuda_graph and device.startswith("cuda") else 0,
        )

    @property
    def max_bs(self) -> int:
        return self.batch_sizes[-1] if self.batch_sizes else 0

    @property
    def max_width(self) -> int:
        return self.widths[-1] if self.widths else 0

    @property
    def max_tokens(self) -> int:
        return self.max_bs * self.max_width

    def buckets(self) -> list:
        return [(bs, w) for bs in self.batch_sizes for w in self.widths]

    def bucket(self, batch_size: int, width: int) -> Optional[tuple]:
        """The smallest captured (batch size, width) that holds this batch, or
        None when the batch must run eagerly."""
        if not self.enabled or batch_size < 1 or width < 1:
            return None
        i = bisect.bisect_left(self.batch_sizes, batch_size)
        j = bisect.bisect_left(self.widths, width)
        if i == len(self.batch_sizes) or j == len(self.widths):
            return None
        return self.batch_sizes[i], self.widths[j]

    def route(self, batch_size: int, speculate: bool, width: int) -> str:
        """How a decode step runs: a verify step replays a verify graph when a
        bucket holds it; a plain one-token step (``speculate`` False: the
        fallback, or nothing drafted) replays SGLang's decode graphs when they
        cover the batch."""
        if speculate:
            return VERIFY_GRAPH if self.bucket(batch_size, width) else EAGER
        return DECODE_GRAPH if 0 < batch_size <= self.decode_graph_max_bs else EAGER

    def buffer_shapes(self) -> Dict[str, tuple]:
        """Static input buffers, sized for the largest bucket."""
        bs, tokens, w = self.max_bs, self.max_tokens, self.max_width
        return {
            "input_ids": (tokens,),
            "positions": (tokens,),
            "out_cache_loc": (tokens,),
            "seq_lens": (bs,),
            "req_pool_indices": (bs,),
            "tree_mask": (bs * w * w,),
        }


# Values that make a padded row harmless: it reads one committed token, writes
# its KV to slot 0 (reserved by SGLang's allocators as the padding slot) and
# its tree mask row is the root only.
PAD_VALUES = {"input_ids": 0, "positions": 0, "out_cache_loc": 0, "seq_lens": 1, "req_pool_indices": 0,
              "tree_mask": True}


class _CudaGraph:
    """torch.cuda.CUDAGraph behind the small interface the runner uses."""

    def __init__(self, pool):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn: Callable[[], object]):
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


@dataclass
class _Captured:
    graph: object
    output: object
    batch_size: int
    width: int


@dataclass
class VerifyGraphRunner:
    plan: GraphPlan
    forward: Callable[[Dict[str, torch.Tensor], int, int], torch.Tensor]  # (buffers, bs, width) -> [bs*width, V]
    device: str = "cuda"
    dtypes: Dict[str, torch.dtype] = field(default_factory=lambda: {
        "input_ids": torch.int64, "positions": torch.int64, "out_cache_loc": torch.int64,
        "seq_lens": torch.int64, "req_pool_indices": torch.int64, "tree_mask": torch.bool})
    graph_factory: Optional[Callable[[object], object]] = None  # pool -> graph; default: CUDA graphs
    pool: object = None
    warmup_runs: int = 2

    def __post_init__(self):
        if not self.plan.enabled:
            raise ValueError("this GraphPlan is disabled (CPU or --disable-cuda-graph): run the verify step eagerly")
        if self.graph_factory is None:
            if not torch.cuda.is_available():
                raise RuntimeError("CUDA graphs need a CUDA device")
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            self.graph_factory = _CudaGraph
        self.buffers = {name: torch.full(shape, PAD_VALUES[name], dtype=self.dtypes[name], device=self.device)
                        for name, shape in self.plan.buffer_shapes().items()}
        self.graphs: Dict[tuple, _Captured] = {}

    def _views(self, bs: int, width: int) -> Dict[str, torch.Tensor]:
        n = bs * width
        return {"input_ids": self.buffers["input_ids"][:n], "positions": self.buffers["positions"][:n],
                "out_cache_loc": self.buffers["out_cache_loc"][:n], "seq_lens": self.buffers["seq_lens"][:bs],
                "req_pool_indices": self.buffers["req_pool_indices"][:bs],
                "tree_mask": self.buffers["tree_mask"][: bs * width * width]}

    def capture(self) -> None:
        """Capture every bucket, largest first (so later captures reuse the pool)."""
        for bs, width in sorted(self.plan.buckets(), reverse=True):
            views = self._views(bs, width)
            for _ in range(self.warmup_runs):
                self.forward(views, bs, width)
            graph = self.graph_factory(self.pool)
            output = graph.capture(lambda v=views, b=bs, w=width: self.forward(v, b, w))
            self.graphs[(bs, width)] = _Captured(graph, output, bs, width)

    def can_run(self, batch_size: int, width: int) -> bool:
        key = self.plan.bucket(batch_size, width)
        return key is not None and key in self.graphs

    def replay(self, inputs: Dict[str, torch.Tensor], batch_size: int, width: int) -> torch.Tensor:
        """Copy ``inputs`` (shaped for ``batch_size`` x ``width``) into the
        static buffers of its bucket, pad the rest, replay, and return the
        logits rows of the real tokens ([batch_size * width, V])."""
        key = self.plan.bucket(batch_size, width)
        if key is None or key not in self.graphs:
            raise ValueError(f"no captured graph holds batch {batch_size} x width {width}")
        cap = self.graphs[key]
        views = self._views(cap.batch_size, cap.width)
        self._load(views, inputs, batch_size, width, cap.batch_size, cap.width)
        cap.graph.replay()
        out = cap.output.view(cap.batch_size, cap.width, -1)[:batch_size, :width]
        return out.reshape(batch_size * width, -1)

    def _load(self, views, inputs, bs, width, cap_bs, cap_width) -> None:
        for name in ("seq_lens", "req_pool_indices"):
            views[name].fill_(PAD_VALUES[name])
            views[name][:bs].copy_(inputs[name])
        for name in ("input_ids", "positions", "out_cache_loc"):
            dst = views[name].view(cap_bs, cap_width)
            dst.fill_(PAD_VALUES[name])
            dst[:bs, :width].copy_(inputs[name].view(bs, width))
        mask = views["tree_mask"].view(cap_bs, cap_width, cap_width)
        # Padding nodes see only the root: a valid tree whatever the width.
        mask.fill_(False)
        mask[:, :, 0] = True
        mask[:, torch.arange(cap_width), torch.arange(cap_width)] = True
        mask[:bs, :width, :width].copy_(inputs["tree_mask"].view(bs, width, width))
