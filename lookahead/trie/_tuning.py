"""How drafts weigh and rank what they find: the tuned parameters of drafting.

Private: these are not options a user is expected to set.  Each default was
chosen with the model-free replay (``python -m lookahead.replay`` on the
shared traces) as the judge, and a change to one is a change to drafting,
to be measured the same way.  ``LookaheadCache(tuning=DraftTuning(...))``
takes other values, for such experiments and for tests that isolate one
mechanism.  What each mechanism does is explained where it is implemented
(``lookahead/trie/_matching.pyx``, ``_drafting.pyx``, ``_draft_tree.pyx``);
``tests/support/trie_reference.py`` specifies them all in plain Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lookahead.trie.config import check_int, check_number


@dataclass(frozen=True)
class DraftTuning:
    # Gathering occurrences (_gather).
    max_walk: int = 16  # occurrences visited per order and store
    top_walk: int = 64  # ... for the highest order in a request's own store (find the right copy source)
    low_walk: int = 32  # ... for orders 1 and 2 of the shared history in multi-branch drafts (odds for the alternatives)
    max_candidates: int = 64  # occurrences merged into one draft (at most 256 are held)
    enough_candidates: int = 12  # stop trying shorter suffixes after this many
    min_match_len: int = 1  # ignore occurrences matching fewer tokens
    # Weighing them.
    match_exponent: float = 2.0  # occurrence weight = match_len ** exponent
    local_weight: float = 4.0  # the request's own stream weighs this much more (trees)
    chain_local_weight: float = 6.0  # ... in one-branch drafts (a chain wants the likeliest single continuation)
    order_norm: float = 0.0  # 1: each n-gram order weighs the same however many hits it has (0: off)
    confidence: float = 8.0  # pseudo-weight of "something else" in a node's score (_score_children)
    # Copy re-anchoring after an edit (_anchor).
    anchor_window: int = 384  # source tokens searched after the anchor (0: off)
    anchor_below: int = 4  # ... when the best match in the request's own stream is shorter
    anchor_gap: int = 14  # ... skipping at most this many diverged context tokens
    anchor_min: int = 12  # ... behind an anchor verified over at least this many tokens
    anchor_pace: float = 2.0  # ... only in a request advancing at least this many tokens per draft (0: always)
    # The copy cursor (_follow_copy).
    copy_boost: float = 4.0  # weight of the copy being followed, among equally long matches (0: off)
    # Past one mismatch in the request's own stream (_gather).
    mismatch_weight: float = 0.5  # each token matched beyond the mismatch counts this much (0: off)
    # Wildcard paths (_merge_past).
    wildcard_tokens: int = 2  # nothing matches: draft past the context's last 1, then 2 tokens as if any (0: off)
    wildcard_weight: float = 0.05  # ... and past its last token at this weight, in requests whose pace is below:
    wildcard_pace: float = 2.5  # tokens a request advances per draft, moving average (low: not copying)
    wildcard_walk: int = 7  # ... gathered cheaply: this many occurrences per order walked and enough
    wildcard_below: float = 400.0  # ... only while the direct matches weigh less (a 10-token own-stream match)
    # Own output over own prompt (_weigh_output).
    output_weight: float = 2.0  # a request below wildcard_pace: its own output weighs this much more than its prompt
    # What a drafted token must be worth (_select).
    min_score: float = 0.0  # nodes whose estimated acceptance is below this are not drafted (0: off)

    def __post_init__(self):
        for name in ("max_walk", "top_walk", "low_walk", "max_candidates", "enough_candidates",
                     "min_match_len", "anchor_below", "anchor_gap", "anchor_min", "wildcard_walk"):
            check_int(getattr(self, name), 1, name)
        for name in ("anchor_window", "wildcard_tokens"):
            check_int(getattr(self, name), 0, name)
        for name in ("match_exponent", "confidence", "order_norm", "copy_boost", "mismatch_weight", "anchor_pace",
                     "wildcard_weight", "wildcard_pace", "wildcard_below", "min_score"):
            check_number(getattr(self, name), 0, name)
        for name in ("local_weight", "chain_local_weight"):
            check_number(getattr(self, name), 0, name, above=True)
        check_number(self.output_weight, 0, "output_weight", above=True, finite=True)

    def native(self, max_match_len: int):
        """These values, and how far back drafts read the context, as the
        native drafting code takes them."""
        from lookahead.trie._drafting import DraftConfig

        return DraftConfig(max_match_len=max_match_len, **dataclasses.asdict(self))


TUNING_FIELDS = frozenset(f.name for f in dataclasses.fields(DraftTuning))
