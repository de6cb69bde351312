"""The two places where SGLang 0.5.23 needs to know LOOKAHEAD by name.

SGLang's decode CUDA-graph runner captures TARGET_VERIFY graphs whenever a
speculative algorithm is on, and it knows how to build the capture-time
verify input only for its built-in algorithms.  Both hooks below are
installed by the worker's constructor, which runs in the scheduler before
any graph is captured, and only in schedulers that run LOOKAHEAD (so no
other process pays for importing the runner module).  Each one is a no-op
for every other algorithm.

* ``DecodeCudaGraphRunner.get_spec_info`` (AROUND): for LOOKAHEAD, the
  capture-time input is an NGRAM-style verify tree over the runner's mask
  buffer -- the same thing SGLang builds for NGRAM.  Without it the capture
  runs with no spec input and the attention backend cannot plan a
  TARGET_VERIFY forward.
* ``DecodeCudaGraphRunner.can_run_graph`` (AROUND): a LOOKAHEAD batch may
  replay a captured verify graph only when it *is* a verify batch of the
  captured width.  SGLang checks this for NGRAM alone; LOOKAHEAD's plain
  one-token steps (fallback, no draft) and narrower verify steps must run
  eagerly instead of replaying a graph of another shape.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
_installed = False


def _is_lookahead(runner) -> bool:
    algo = getattr(runner.model_runner, "spec_algorithm", None)
    return getattr(algo, "name", None) == "LOOKAHEAD" and not runner.model_runner.is_draft_worker


def _capture_spec_info(original, self, num_tokens):
    spec_info = original(self, num_tokens)
    if spec_info is None and _is_lookahead(self):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        from lookahead.worker import LookaheadVerifyInput

        spec_info = LookaheadVerifyInput(
            draft_token=None,
            custom_mask=self.buffers.custom_mask,
            positions=None,
            retrieve_index=None,
            retrieve_next_token=None,
            retrieve_next_sibling=None,
            draft_token_num=self.captured_req_width,
        )
        spec_info.capture_hidden_mode = CaptureHiddenMode.NULL
    return spec_info


def _can_run_graph(original, self, forward_batch):
    if _is_lookahead(self) and not verify_batch_fits(
        forward_batch.forward_mode.is_target_verify(),
        forward_batch.input_ids.numel(),
        forward_batch.batch_size,
        self.captured_req_width,
    ):
        return False
    return original(self, forward_batch)


def verify_batch_fits(is_target_verify: bool, num_tokens: int, batch_size: int, captured_width: int) -> bool:
    """Whether a batch has the shape of a captured LOOKAHEAD verify graph."""
    return is_target_verify and num_tokens == batch_size * captured_width


def install() -> None:
    """Register and apply both hooks (idempotent)."""
    global _installed
    if _installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{_RUNNER}.get_spec_info", _capture_spec_info, HookType.AROUND)
    HookRegistry.register(f"{_RUNNER}.can_run_graph", _can_run_graph, HookType.AROUND)
    HookRegistry.apply_hooks()
    _installed = True
    logger.debug("LOOKAHEAD: CUDA-graph runner hooks installed")
