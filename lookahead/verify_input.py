"""``LookaheadVerifyInput``: a LOOKAHEAD verify tree as SGLang's verify flow sees it.

It is NGRAM's ``NgramVerifyInput`` (the same tree layout, mask and KV
handling) with two additions:

* ``is_chain``: a batch whose trees are all single chains says so through
  ``tree_topk == 1``, so attention backends and the greedy verify kernel take
  their causal fast paths (intel_amx skips the tree mask);
* ``penalty_inputs``: the host-side tree and the committed tokens the
  penalizers have not counted yet, for ``lookahead.tree_penalties``; set only
  in batches that use penalties.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.speculative.ngram_info import NgramVerifyInput


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
