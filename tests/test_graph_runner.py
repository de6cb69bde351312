"""The verify CUDA-graph runner's policy and its capture/replay bookkeeping.

The policy (buckets, buffer sizes, routes, the disabled path) is pure Python.
Capture and replay are exercised on CPU with a recorder standing in for
``torch.cuda.CUDAGraph`` (it re-runs the captured call on replay, reading the
same static buffers), so padding and slicing are checked without a GPU; the
real CUDA capture runs only where CUDA is available.
"""

from __future__ import annotations

import pytest
import torch

from lookahead.graph_runner import DECODE_GRAPH, EAGER, VERIFY_GRAPH, GraphPlan, VerifyGraphRunner
from lookahead.sglang_hooks import verify_batch_fits


def test_disabled_on_cpu_and_with_disable_cuda_graph():
    for device, disabled in (("cpu", False), ("cuda", True)):
        plan = GraphPlan.for_server(device=device, disable_cuda_graph=disabled, max_batch_size=4, num_draft_tokens=8)
        assert not plan.enabled and plan.buckets() == [] and plan.bucket(1, 8) is None
        assert plan.route(1, True, 8) == EAGER and plan.route(8, False, 1) == EAGER
        with pytest.raises(ValueError, match="disabled"):
            VerifyGraphRunner(plan, forward=lambda b, bs, w: None, graph_factory=lambda pool: None)


def test_buckets_cover_batch_sizes_one_to_max():
    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=4, num_draft_tokens=8,
                                widths=(4, 8), decode_graph_max_bs=32)
    assert plan.batch_sizes == (1, 2, 3, 4) and plan.widths == (4, 8)
    assert len(plan.buckets()) == 8
    assert plan.bucket(3, 2) == (3, 4) and plan.bucket(3, 5) == (3, 8) and plan.bucket(1, 8) == (1, 8)
    assert plan.bucket(5, 4) is None and plan.bucket(2, 9) is None and plan.bucket(0, 4) is None


def test_routes_follow_the_fallback_rule():
    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=4, num_draft_tokens=8,
                                decode_graph_max_bs=16)
    assert plan.route(4, True, 8) == VERIFY_GRAPH
    assert plan.route(6, True, 8) == EAGER  # speculating above the captured sizes
    assert plan.route(6, False, 1) == DECODE_GRAPH  # the fallback replays SGLang's decode graphs
    assert plan.route(32, False, 1) == EAGER  # beyond them it is eager


def test_buffer_sizes():
    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=4, num_draft_tokens=8)
    shapes = plan.buffer_shapes()
    assert shapes["input_ids"] == (32,) and shapes["seq_lens"] == (4,) and shapes["tree_mask"] == (4 * 64,)
    with pytest.raises(ValueError):
        GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=4, num_draft_tokens=8, widths=(9,))
    with pytest.raises(ValueError):
        GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=-1, num_draft_tokens=8)


class _Recorder:
    """Stands in for a CUDA graph: replay re-runs the captured call."""

    captures = 0

    def __init__(self, pool):
        self.fn = None

    def capture(self, fn):
        _Recorder.captures += 1
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self):
        self.out.copy_(self.fn())


def _toy_forward(buffers, bs, width):
    """Logits whose every row depends on its token, position, row and mask row."""
    ids = buffers["input_ids"].view(bs, width).float()
    pos = buffers["positions"].view(bs, width).float()
    mask = buffers["tree_mask"].view(bs, width, width).float()
    seq = buffers["seq_lens"].float().view(bs, 1)
    base = ids * 3 + pos * 5 + mask.sum(-1) * 7 + seq
    return torch.stack([base, base * 2, -base], dim=-1).reshape(bs * width, 3)


@pytest.mark.parametrize("bs,width", [(1, 8), (2, 3), (3, 5), (4, 8)])
def test_replay_matches_an_unpadded_forward(bs, width):
    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=4, num_draft_tokens=8,
                                widths=(4, 8))
    runner = VerifyGraphRunner(plan, _toy_forward, device="cpu", graph_factory=_Recorder, warmup_runs=1)
    _Recorder.captures = 0
    runner.capture()
    assert _Recorder.captures == len(plan.buckets())
    g = torch.Generator().manual_seed(bs * 10 + width)
    inputs = {
        "input_ids": torch.randint(0, 100, (bs * width,), generator=g),
        "positions": torch.randint(0, 50, (bs * width,), generator=g),
        "out_cache_loc": torch.randint(1, 100, (bs * width,), generator=g),
        "seq_lens": torch.randint(5, 60, (bs,), generator=g),
        "req_pool_indices": torch.arange(bs),
        "tree_mask": torch.tril(torch.ones(width, width, dtype=torch.bool)).repeat(bs, 1, 1).flatten(),
    }
    assert runner.can_run(bs, width)
    got = runner.replay(inputs, bs, width)
    assert got.shape == (bs * width, 3)
    assert torch.equal(got, _toy_forward(inputs, bs, width))
    assert not runner.can_run(5, width)
    with pytest.raises(ValueError):
        runner.replay(inputs, 5, width)


def test_lookahead_batches_replay_only_verify_graphs_of_their_width():
    assert verify_batch_fits(True, 4 * 8, 4, 8)
    assert not verify_batch_fits(False, 4, 4, 8)  # a plain decode step
    assert not verify_batch_fits(True, 4 * 5, 4, 8)  # a narrower verify step


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_cuda_capture_replays_bit_identically():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(128, 32).cuda()
    head = torch.nn.Linear(32, 128).cuda()

    def forward(buffers, bs, width):
        x = emb(buffers["input_ids"]) + buffers["positions"].float().unsqueeze(-1)
        m = buffers["tree_mask"].view(bs, width, width).float()
        h = torch.bmm(m, x.view(bs, width, -1)).view(bs * width, -1)
        return head(h)

    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=4, num_draft_tokens=8)
    runner = VerifyGraphRunner(plan, forward)
    runner.capture()
    for bs in (1, 2, 3, 4):
        inputs = {"input_ids": torch.randint(0, 128, (bs * 8,), device="cuda"),
                  "positions": torch.arange(bs * 8, device="cuda"), "out_cache_loc": torch.zeros(bs * 8, device="cuda"),
                  "seq_lens": torch.full((bs,), 9, device="cuda"), "req_pool_indices": torch.arange(bs, device="cuda"),
                  "tree_mask": torch.tril(torch.ones(8, 8, dtype=torch.bool, device="cuda")).repeat(bs, 1, 1).flatten()}
        assert torch.equal(runner.replay(inputs, bs, 8), forward(inputs, bs, 8))
