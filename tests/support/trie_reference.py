"""A pure-Python reference model of the drafting core (the executable spec).

It reproduces, call for call, the drafts that the native trie
(``lookahead.trie._store``, ``_matching``, ``_drafting``, ``_draft_tree``) and
``lookahead.trie.cache.LookaheadCache`` return once every insert has been applied
(that is, after ``synchronize()``): same tokens, same parents, same order.
Speed is no concern here; readability is.

The model
---------
A *store* is a token stream (``-1`` separates requests in the shared history).
For every n-gram order ``k`` it indexes each position ``p`` whose last ``k``
tokens contain no separator.  The native code keeps, per order, a hash table
of chains (most recent first); the model keeps the same thing as a list of
positions per hash slot.  The hash and the slot count are modelled exactly,
so hash collisions (different n-grams sharing a chain, and using up
``max_walk`` steps) behave as in the native code.  A shared history is a
ring of ``cap`` tokens: positions below ``n - cap`` are evicted, and so are
those below ``lo`` (see ``RefStore.resize``).  There is one per scope
(``put_prompt(scope=...)``), and its chains are those of a full-size ring
(``config.shared_capacity`` tokens, half as many hash slots) whatever its
``cap``: a small history's chains hold the same positions, collisions
included, as the full ring's would.

Drafting one request after ``context`` (only its last ``max_match_len`` ids):

1. *Gather*, per store (the request's own store first, weighted
   ``local_weight``, or ``chain_local_weight`` for a one-branch draft, then
   the shared history, weighted 1.0): for each order
   ``k`` from the highest down (skipping ``k > len(ctx)`` and
   ``k < min_match_len``), walk the chain of the slot of the context's last
   ``k`` ids, most recent first, at most ``max_walk`` steps (every chain
   entry is a step, even a collision or a partly evicted n-gram).  An entry
   ``q`` is an occurrence when it matches ``m >= k`` context ids going back
   (``m`` capped at ``max_match_len`` and at the oldest live token), has a
   continuation (``q + 1 < n`` and ``tok[q + 1]`` is no separator) and was not
   found before in this store.  Its weight is
   ``store_weight * (m + mismatch_weight * b) ** match_exponent``, where ``b``
   is 0 in the shared history and, in the request's own store, the number of
   further context ids matched past the mismatch that ended ``m`` (that
   mismatched token is skipped on both sides; no separator; ``m + 1 + b``
   stays below ``max_match_len``).  Stop the walk once
   ``max_candidates`` occurrences are held (both stores together), and stop
   descending orders once this store found ``enough_candidates`` or
   ``max_candidates`` are held.  With ``order_norm > 0`` every occurrence of
   an order is divided by (its order's occurrence count) ** order_norm.
   The shared history is only searched if fewer than ``max_candidates``
   occurrences were found in the request's own store.
   In the request's own store, after re-anchoring and following the copy
   (see ``anchor`` and ``follow_copy``; re-anchoring waits for a pace of
   ``anchor_pace`` or more, and gives way to a shared
   match of ``anchor_min`` or more, the copy boost to a shared match longer
   than the copy's: see ``shared_match``), each occurrence in the output (at or
   after the prompt's end) is multiplied by ``output_weight`` while the
   request's pace (see step 2) is below ``wildcard_pace``.
2. *Merge* the continuation of each occurrence, in the order found, into a
   draft trie (up to ``budget`` tokens, stopping at a separator or at the end
   of the stream): every node on the path gains the occurrence's weight, and
   so does the root when the continuation is non-empty.  A new node is
   numbered after all existing ones and becomes its parent's *first* child.
   If nothing was merged (the context's last token occurs nowhere with a
   continuation), try again for ``skip`` = 1, 2, ... ``wildcard_tokens``
   until something is: gather the occurrences of the context without its
   last ``skip`` tokens (from each store as in step 1, candidates counted
   afresh) and merge, for each whose next ``skip`` tokens exist and hold no
   separator, the continuation after those ``skip`` tokens.  If something
   was merged, and the request's *pace* is below ``wildcard_pace``, merge
   the same for ``skip`` = 1 with both store weights times
   ``wildcard_weight``, gathering with ``max_walk`` and ``enough_candidates``
   both ``wildcard_walk`` and no ``top_walk`` or ``low_walk``, unless the
   root's weight is already ``wildcard_below`` or more.  The pace is a moving average of how many tokens the
   request's store grew by between its drafts (``PACE_DECAY``, starting at
   ``INITIAL_PACE``; a draft without a request store sees the initial pace).
3. *Select*:
   * one branch: from the root, repeatedly step to the heaviest child (ties:
     the lower node number) until ``budget`` tokens or a leaf;
   * multi-branch: score(root) = 1; score(child) = weight(child) *
     score(parent) / (weight(parent) + confidence); take the frontier node
     with the best score (ties: the lower node number), ``budget`` times,
     adding its children to the frontier.  ``parents[i]`` is the output index
     of node ``i``'s parent, ``-1`` for children of the root.

The cache (``LookaheadCache``) around it: a request's store holds its prompt
and then its outputs.  Outputs are *shared* (appended to the request's
scope's history as ``[-1] + context + new output``) every ``flush_tokens``
tokens and at ``finish``; the context is the last ``share_tail`` (see
there) prompt tokens the first time and the last ``max(orders)`` tokens
afterwards.  A request drafts from its own store and its scope's history,
then the stores of the (at most ``GROUP_PEERS``) latest other live requests
of its scope with the same prompt (its group: the samples of one prompt), as
if they were more history; a request put with ``share=False`` shares nothing
and drafts from no history.
How big each history is (``Resize``) and which are dropped (``Drop``) is
``lookahead.trie.scopes.ScopeBudget``'s decision, in plain Python, taken before
each share; the model applies the same decisions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1
SEPARATOR = -1
MAX_CANDIDATES_LIMIT = 256  # the native scratch size caps max_candidates
INITIAL_PACE = 2.0  # a request's pace before its first draft
PACE_DECAY = 0.8  # pace = PACE_DECAY * pace + (1 - PACE_DECAY) * (tokens the store grew by since the last draft)


def log2_ceil(x: int) -> int:
    b = 0
    while (1 << b) < x:
        b += 1
    return b


def ngram_hash(backwards) -> int:
    """The native n-gram hash; ``backwards`` lists the n-gram's ids from the
    last one to the first."""
    h = 0
    for t in backwards:
        h = ((h ^ t) * GOLDEN) & MASK64
    return h


class RefStore:
    """A token stream and its per-order occurrence index (chains by hash slot)."""

    def __init__(self, capacity: int, ring: bool, orders, key_bits: int | None = None):
        self.orders = tuple(orders)
        self.ring = ring
        self.lo = 0  # no position below is live (see resize)
        if key_bits is not None:
            # A scope's history: empty until resized, keyed as the full ring.
            self.cap = 0
            self.hbits = key_bits
        else:
            self.cap = 1 << log2_ceil(max(capacity, 16))
            # The shared ring has half as many hash slots as tokens; a request's
            # store one per token (re-hashed as it grows, see append).
            self.hbits = log2_ceil(self.cap // 2 if ring else self.cap)
        self.toks: list[int] = []  # every token ever appended (the ring hides the old ones)
        self._slots: dict = {}  # (order, hbits) -> {slot: [positions, ascending]}
        self._indexed: dict = {}  # (order, hbits) -> positions indexed so far
        self.cursor = (-1, -1, -1)  # copy cursor of a request's store: (n, used, src), see follow_copy
        self.pace = INITIAL_PACE  # of a request's store: see draft
        self.prompt_end: int | None = None  # where a request's output starts (set by RefCache.put_prompt)

    @property
    def n(self) -> int:
        return len(self.toks)

    @property
    def base(self) -> int:
        """The oldest live position."""
        return max(self.lo, self.n - self.cap) if self.ring else 0

    def resize(self, capacity: int) -> None:
        """A scope's history gets room for ``capacity`` tokens: its newest
        ones stay (where they are: positions are absolute), the rest goes."""
        self.lo = max(self.base, self.n - capacity)
        self.cap = capacity

    def append(self, tokens) -> None:
        tokens = [int(t) for t in tokens]
        if not tokens:
            return
        if not self.ring:
            new_cap = self.cap
            while new_cap < self.n + len(tokens):
                new_cap *= 2
            if new_cap != self.cap:
                self.cap = new_cap
                if self.cap > (2 << self.hbits):
                    self.hbits = log2_ceil(self.cap)
        self.toks.extend(tokens)

    def slot_of(self, backwards) -> int:
        return ngram_hash(backwards) >> (64 - self.hbits)

    def chain(self, k: int, slot: int) -> list[int]:
        """The positions on the order-``k`` chain of ``slot``, most recent first:
        every position whose last ``k`` tokens (no separator among them) hash
        to ``slot``, including evicted ones (the walk stops at those)."""
        key = (k, self.hbits)
        table = self._slots.setdefault(key, {})
        start = self._indexed.get(key, 0)
        for p in range(start, self.n):
            gram = self.toks[p - k + 1: p + 1] if p >= k - 1 else []
            if len(gram) == k and min(gram) >= 0:
                table.setdefault(self.slot_of(reversed(gram)), []).append(p)
        self._indexed[key] = self.n
        return table.get(slot, [])[::-1]

    def slice(self, start: int, end: int) -> list[int]:
        start = max(start, self.base, 0)
        return self.toks[start:end]


@dataclass
class Candidate:
    pos: int
    match: int
    weight: float


@dataclass
class Node:
    token: int
    parent: int
    weight: float = 0.0
    score: float = 0.0
    children: list = field(default_factory=list)  # newest first, like the native sibling list


def _pow(base: float, e: float) -> float:
    if e == 2.0:
        return base * base
    if e == 1.0:
        return base
    return math.pow(base, e)


@dataclass
class Params:
    """The drafting parameters (``DraftParams`` in ``_matching.pxd``): how
    far back the context is read (``max_match``, the config's
    ``max_match_len``) and the tuning (``lookahead.trie._tuning.DraftTuning``)."""

    max_match: int
    max_walk: int
    max_candidates: int
    enough_candidates: int
    match_exponent: float
    local_weight: float
    chain_local_weight: float
    min_match: int
    confidence: float
    order_norm: float
    top_walk: int
    low_walk: int
    anchor_window: int
    anchor_below: int
    anchor_gap: int
    anchor_min: int
    copy_boost: float
    wildcard_tokens: int
    mismatch_weight: float
    wildcard_weight: float
    wildcard_pace: float
    wildcard_walk: int
    wildcard_below: float
    output_weight: float
    anchor_pace: float
    min_score: float = 0.0

    def __post_init__(self):
        self.max_candidates = min(self.max_candidates, MAX_CANDIDATES_LIMIT)

    @classmethod
    def from_config(cls, config, tuning=None) -> "Params":
        """What a cache of ``config`` and ``tuning`` (None: the tuned
        defaults) drafts with."""
        from lookahead.trie._tuning import DraftTuning

        knobs = dataclasses.asdict(DraftTuning() if tuning is None else tuning)
        knobs["min_match"] = knobs.pop("min_match_len")
        return cls(max_match=config.max_match_len, **knobs)


def gather(store: RefStore, ctx: list, prm: Params, store_weight: float, cands: list,
           one_branch: bool = False, shared_walk: dict | None = None) -> int:
    """Append ``store``'s occurrences of the context's suffixes to ``cands``.

    ``shared_walk`` (the request's shared stores, read as one store: its
    scope's history, then its corpora): per order, the chain steps taken and
    the occurrences gathered by the shared stores read before this one.  An
    order's walk here takes only the steps they left, and the descent stops
    once they and this store together hold ``enough_candidates`` at the
    orders tried."""
    if store.n == 0 or not ctx:
        return 0
    start_count = len(cands)
    max_match = min(prm.max_match, len(ctx))
    base, n, toks = store.base, store.n, store.toks
    found = 0
    for k in reversed(store.orders):
        if k > len(ctx) or k < prm.min_match:
            continue
        order_start = len(cands)
        slot = store.slot_of(reversed(ctx[-k:]))
        steps = 0
        walk = prm.max_walk
        if k == store.orders[-1] and prm.top_walk > walk and not store.ring:
            walk = prm.top_walk
        if k <= 2 and not one_branch and prm.low_walk > walk and store.ring:
            walk = prm.low_walk
        if shared_walk is not None:
            walk -= shared_walk.setdefault(k, [0, 0])[0]
        for q in store.chain(k, slot):
            if q < base or steps >= walk:
                break
            steps += 1
            m = 0
            while m < max_match and q - m >= base and toks[q - m] == ctx[-1 - m]:
                m += 1
            if m < k or q + 1 >= n or toks[q + 1] < 0:
                continue
            if any(c.pos == q for c in cands[start_count:]):
                continue
            beyond = 0  # the request's own store: tokens matched past one mismatch
            if prm.mismatch_weight > 0 and not store.ring and m < max_match and q - m >= base and toks[q - m] >= 0:
                while (m + 1 + beyond < max_match and q - m - 1 - beyond >= base
                       and toks[q - m - 1 - beyond] >= 0 and toks[q - m - 1 - beyond] == ctx[-2 - m - beyond]):
                    beyond += 1
            cands.append(Candidate(q, m, store_weight * _pow(m + prm.mismatch_weight * beyond, prm.match_exponent)))
            found += 1
            if len(cands) >= prm.max_candidates:
                break
        if prm.order_norm > 0 and len(cands) > order_start:
            scale = math.pow(float(len(cands) - order_start), -prm.order_norm)
            for c in cands[order_start:]:
                c.weight *= scale
        total = found
        if shared_walk is not None:
            shared_walk[k][0] += steps
            shared_walk[k][1] += len(cands) - order_start
            total = sum(f for kk, (_, f) in shared_walk.items() if kk >= k)
        if total >= prm.enough_candidates or len(cands) >= prm.max_candidates:
            break
    return found


def shared_match(shareds, ctx: list, prm: Params) -> int:
    """How far back the shared stores match the context at best: the longest
    match among the first ``max_walk`` occurrences of its highest-order
    suffix in each (see ``_shared_match`` in the native code)."""
    best = 0
    for sh in shareds:
        probe = dataclasses.replace(prm, min_match=sh.orders[-1], top_walk=0, low_walk=0,
                                    enough_candidates=1, max_candidates=4, mismatch_weight=0.0)
        found: list = []
        gather(sh, ctx, probe, 1.0, found)
        best = max([best] + [c.match for c in found])
    return best


def anchor(store: RefStore, ctx: list, prm: Params, weight: float, cands: list) -> None:
    """Copy re-anchoring after an edit (the request's own store, which the
    context ends): see ``_anchor`` in the native code."""
    m_best = max((c.match for c in cands), default=0)
    if m_best >= prm.anchor_below:
        return
    base, n, toks = store.base, store.n, store.toks
    K = store.orders[-1]
    r, best_am, o = -1, 0, 0
    for o in range(1, prm.anchor_gap + 1):
        if o + K > len(ctx):
            return
        slot = store.slot_of(reversed(ctx[len(ctx) - o - K: len(ctx) - o]))
        best_am, steps = 0, 0
        for q in store.chain(K, slot):
            if q < base or steps >= 8:
                break
            steps += 1
            if q < n - 1 - o:
                am = 0
                while am < len(ctx) - o and am < 64 and q - am >= base and toks[q - am] == ctx[-1 - o - am]:
                    am += 1
                if am > best_am:
                    best_am, r = am, q
        if best_am >= K and best_am >= prm.anchor_min:
            break
        r = -1
    if r < 0:
        return
    end = min(r + 1 + prm.anchor_window, n - 1)
    best_q, best_mq, best_dist = -1, 0, 0
    for q in range(r + 1, end):
        mq = 0
        while mq < o and q - mq >= base and toks[q - mq] == ctx[-1 - mq]:
            mq += 1
        if mq > 0 and toks[q + 1] >= 0:
            dist = abs(q - (r + o))
            if mq > best_mq or (mq == best_mq and dist < best_dist):
                best_q, best_mq, best_dist = q, mq, dist
    if best_q < 0:
        return
    match = best_mq + best_am
    cand = Candidate(best_q, match, weight * _pow(float(match), prm.match_exponent))
    for i, c in enumerate(cands):
        if c.pos == best_q:
            cands[i] = cand
            return
    cands.append(cand)


def child(nodes: list, parent: int, token: int) -> int:
    for c in nodes[parent].children:
        if nodes[c].token == token:
            return c
    nodes.append(Node(token, parent))
    nodes[parent].children.insert(0, len(nodes) - 1)
    return len(nodes) - 1


def merge(store: RefStore, cand: Candidate, depth: int, nodes: list) -> None:
    q, cur = cand.pos + 1, 0
    for i in range(depth):
        if q >= store.n or store.toks[q] < 0:
            break
        if i == 0:
            nodes[0].weight += cand.weight
        cur = child(nodes, cur, store.toks[q])
        nodes[cur].weight += cand.weight
        q += 1


def follow_copy(store: RefStore, ctx: list, prm: Params, weight: float, cands: list,
                shared_match=lambda: 0) -> None:
    """Prefer the copy being followed (the request's own store): see
    ``_follow_copy`` in the native code."""
    n = store.n
    last_n, used, src = store.cursor
    q = used if n == last_n else (src + n - last_n if src >= 0 and n > last_n else -1)
    toks = store.toks
    if q >= 0 and q + 1 < n and toks[q + 1] >= 0:
        m = 0
        while m < prm.max_match and m < len(ctx) and q - m >= 0 and toks[q - m] == ctx[-1 - m]:
            m += 1
        if m > 0 and m >= max((c.match for c in cands), default=0) and m >= shared_match():
            for c in cands:
                if c.pos == q:
                    c.weight *= prm.copy_boost
                    break
            else:
                cands.append(Candidate(q, m, prm.copy_boost * weight * _pow(float(m), prm.match_exponent)))
    heaviest = max(cands, key=lambda c: c.weight, default=None)  # ties: the first found
    store.cursor = (last_n, q, heaviest.pos if heaviest is not None else -1)  # draft advances n


def select(nodes: list, budget: int, one_branch: bool, confidence: float,
           min_score: float = 0.0) -> tuple[list, list, float]:
    """The draft and its expected accepted tokens: the sum of its nodes'
    scores; a node scoring below ``min_score`` is not drafted."""
    tokens, parents, expected = [], [], 0.0
    if budget <= 0 or len(nodes) <= 1:
        return tokens, parents, expected
    if one_branch:
        cur, score = 0, 1.0
        while len(tokens) < budget and nodes[cur].children:
            best = max(nodes[cur].children, key=lambda j: (nodes[j].weight, -j))
            score *= nodes[best].weight / (nodes[cur].weight + confidence)
            if score < min_score:
                break
            expected += score
            parents.append(len(tokens) - 1)
            tokens.append(nodes[best].token)
            cur = best
        return tokens, parents, expected

    def score_children(p: int) -> None:
        scale = nodes[p].score / (nodes[p].weight + confidence)
        for j in nodes[p].children:
            nodes[j].score = nodes[j].weight * scale
            frontier.append(j)

    out_index = {}
    frontier: list[int] = []
    nodes[0].score = 1.0
    score_children(0)
    while len(tokens) < budget and frontier:
        best = max(frontier, key=lambda j: (nodes[j].score, -j))
        if nodes[best].score < min_score:
            break
        frontier.remove(best)
        out_index[best] = len(tokens)
        tokens.append(nodes[best].token)
        expected += nodes[best].score
        parent = nodes[best].parent
        parents.append(out_index[parent] if parent > 0 else -1)
        score_children(best)
    return tokens, parents, expected


def draft(local: RefStore | None, shared, context, budget: int, one_branch: bool,
          prm: Params) -> tuple[list, list, float]:
    """``shared``: the scope's history (or None), or a list of it and the
    request's corpora: the shared stores are read in that order, as one
    store holding them all would be (see ``gather``)."""
    shareds = [s for s in (shared if isinstance(shared, (list, tuple)) else [shared]) if s is not None]
    tail = prm.max_match
    if prm.anchor_window > 0:
        tail = max(tail, prm.anchor_gap + prm.anchor_min + 32)
    ctx = [int(t) for t in list(context)[-tail:]] if prm.max_match > 0 else []
    if not ctx or budget <= 0:
        return [], [], 0.0
    nodes = [Node(-1, -1, score=1.0)]
    cands: list[Candidate] = []
    local_weight = prm.chain_local_weight if one_branch else prm.local_weight
    pace = INITIAL_PACE
    if local is not None:
        last_n = local.cursor[0]
        if last_n >= 0 and local.n > last_n:
            local.pace = PACE_DECAY * local.pace + (1.0 - PACE_DECAY) * (local.n - last_n)
        pace = local.pace
        gather(local, ctx, prm, local_weight, cands, one_branch)
        # A shared exact match outranks the own store's guesses (see _draft).
        shared_m = None
        anchoring = prm.anchor_window > 0 and pace >= prm.anchor_pace
        if anchoring and shareds and max((c.match for c in cands), default=0) < prm.anchor_below:
            shared_m = shared_match(shareds, ctx, prm)
        if anchoring and (shared_m or 0) < prm.anchor_min:
            anchor(local, ctx, prm, local_weight, cands)
        if prm.copy_boost > 0:
            follow_copy(local, ctx, prm, local_weight, cands,
                        lambda: shared_m if shared_m is not None else shared_match(shareds, ctx, prm))
        if local.prompt_end is not None and pace < prm.wildcard_pace:
            for c in cands:
                if c.pos >= local.prompt_end:
                    c.weight *= prm.output_weight
        local.cursor = (local.n,) + local.cursor[1:]
        for c in cands:
            merge(local, c, budget, nodes)
    shared_walk: dict = {}
    for sh in shareds:
        first_shared = len(cands)
        if len(cands) < prm.max_candidates:
            gather(sh, ctx, prm, 1.0, cands, one_branch, shared_walk)
            for c in cands[first_shared:]:
                merge(sh, c, budget, nodes)
    # Nothing matched: draft past the context's last 1, 2, ... tokens; when
    # something did, past the last one at wildcard_weight if the pace is low.
    def merge_past(skip: int, local_w: float, shared_w: float, prm: Params = prm) -> None:
        cands, shared_walk = [], {}
        if local is not None:
            gather_past(local, ctx, skip, prm, local_w, cands, one_branch, budget, nodes)
        for sh in shareds:
            if len(cands) < prm.max_candidates:
                gather_past(sh, ctx, skip, prm, shared_w, cands, one_branch, budget, nodes, shared_walk)

    if len(nodes) > 1:
        if prm.wildcard_weight > 0 and pace < prm.wildcard_pace and len(ctx) > 1 \
                and nodes[0].weight < prm.wildcard_below:
            merge_past(1, local_weight * prm.wildcard_weight, prm.wildcard_weight,
                       dataclasses.replace(prm, max_walk=prm.wildcard_walk, enough_candidates=prm.wildcard_walk,
                                           top_walk=0, low_walk=0))
    else:
        skip = 1
        while len(nodes) == 1 and skip <= prm.wildcard_tokens and skip < len(ctx):
            merge_past(skip, local_weight, 1.0)
            skip += 1
    return select(nodes, budget, one_branch, prm.confidence, prm.min_score)


def gather_past(store: RefStore, ctx: list, skip: int, prm: Params, weight: float, cands: list,
                one_branch: bool, depth: int, nodes: list, shared_walk: dict | None = None) -> None:
    """Occurrences of the context minus its last ``skip`` tokens, continued
    ``skip`` tokens further on (none of them a separator), merged."""
    first = len(cands)
    gather(store, ctx[:-skip], prm, weight, cands, one_branch, shared_walk)
    for c in cands[first:]:
        if all(c.pos + j < store.n and store.toks[c.pos + j] >= 0 for j in range(1, skip + 1)):
            c.pos += skip
            merge(store, c, depth, nodes)


# ---------------------------------------------------------------------------
# The cache around the stores
# ---------------------------------------------------------------------------


@dataclass
class RefRequest:
    store: RefStore
    prompt_len: int
    shared_upto: int
    scope: object = None  # its scope's key, or PRIVATE
    share: bool = True
    corpora: object = None  # the corpus ids it chose (None: every one it may see)
    tail: int = 0  # prompt tokens shared before its output (share_tail)
    prompt: tuple = ()
    answer: object = None  # the answer its prompt got before, while followed (see follow_answer)


def share_tail(prompt: list, config) -> int:
    """``share_prompt_tail``, or ``share_tail_margin`` past the longest
    suffix of the prompt that also occurs earlier in it (at most
    ``max_match_len``)."""
    if config.share_tail_margin == 0 or len(prompt) < 2:
        return config.share_prompt_tail
    n, best = len(prompt), 0
    limit = max(0, min(n - 1, config.max_match_len - config.share_tail_margin))
    for end in range(n - 1):
        k = 0
        while k <= limit and end - k >= 0 and prompt[end - k] == prompt[n - 1 - k]:
            k += 1
        best = max(best, k)
    return max(config.share_prompt_tail, min(min(best, limit) + config.share_tail_margin, config.max_match_len))


class RefCache:
    """``LookaheadCache`` as seen after ``synchronize()``."""

    def __init__(self, config, tuning=None):
        from lookahead.trie.scopes import ScopeBudget

        self.config = config
        self.params = Params.from_config(config, tuning)
        self.budget = ScopeBudget(config.max_memory_bytes, config.shared_capacity, len(config.orders))
        self.requests: dict = {}
        self.corpora: dict = {}  # id -> (scope, [RefStore pieces])
        self.answers: dict = {}  # (scope, prompt) -> the first 64 tokens of its latest answer, oldest used first
        self.groups: dict = {}  # (scope, prompt) -> its live requests' rids, in arrival order

    def add_corpus(self, corpus_id, stream, scope=None) -> None:
        """A corpus (one stream, -1 between documents), cut into pieces as
        ``lookahead.trie.corpora`` cuts it (the layout, not the drafting)."""
        import numpy as np

        from lookahead.trie.corpora import _cuts, piece_sizes

        stream = np.asarray(stream, dtype=np.int32)
        sizes = piece_sizes(len(stream))
        cuts = _cuts(stream, sizes)
        sizes = [max(cap, 1 << max(0, (e - s - 1).bit_length())) for cap, (s, e) in zip(sizes, cuts)]
        pieces = []
        for cap, (s, e) in zip(sizes, cuts):
            piece = RefStore(cap, True, self.config.orders)
            piece.append(stream[s:e].tolist())
            pieces.append(piece)
        self.corpora[corpus_id] = (scope, pieces)

    def remove_corpus(self, corpus_id) -> None:
        del self.corpora[corpus_id]

    def corpus_stores(self, req: RefRequest) -> list:
        # Public corpora by id, then the request's scope's, by id.
        scope = req.scope if req.share else object()
        out = []
        for _, cid in sorted((cs is not None, cid) for cid, (cs, _) in self.corpora.items()):
            cs, pieces = self.corpora[cid]
            if (cs is None or cs == scope) and (req.corpora is None or cid in req.corpora):
                out.extend(pieces)
        return out

    def history(self, scope) -> RefStore | None:
        held = self.budget.scopes.get(scope)
        return None if held is None else held.store

    def put_prompt(self, rid, tokens, scope=None, share: bool = True, corpora=None) -> None:
        tokens = [int(t) for t in tokens]
        assert rid not in self.requests
        store = RefStore(max(1024, 2 * len(tokens) + 256), False, self.config.orders)
        store.append(tokens)
        store.prompt_end = len(tokens)
        req = self.requests[rid] = RefRequest(store, len(tokens), len(tokens), scope, share,
                                              None if corpora is None else frozenset(corpora),
                                              share_tail(tokens, self.config), tuple(tokens))
        if share and self.config.share_outputs and tokens:
            self.groups.setdefault((scope, req.prompt), []).append(rid)
        if share and self.config.share_outputs and (scope, req.prompt) in self.answers:
            req.answer = self.answers.pop((scope, req.prompt))
            self.answers[(scope, req.prompt)] = req.answer
        if share:
            self.budget.touch(scope)

    def put_output(self, rid, tokens) -> None:
        req = self.requests[rid]
        req.store.append(tokens)
        if req.share and self.config.share_outputs and req.store.n - req.shared_upto >= self.config.flush_tokens:
            self._share(req)

    def finish(self, rid) -> None:
        req = self.requests.pop(rid)
        group = self.groups.get((req.scope, req.prompt))
        if group is not None and rid in group:
            group.remove(rid)
            if not group:
                del self.groups[(req.scope, req.prompt)]
        if req.share and self.config.share_outputs:
            self._share(req)

    def _share(self, req: RefRequest) -> None:
        from lookahead.trie.scopes import Drop

        start, end = req.shared_upto, req.store.n
        if end <= start:
            return
        context = req.tail if start == req.prompt_len else max(self.config.orders)
        if start == req.prompt_len and self.config.remember_answers > 0 and req.prompt_len > 0:
            self.answers.pop((req.scope, req.prompt), None)
            self.answers[(req.scope, req.prompt)] = req.store.slice(start - 1, min(end, start + ANSWER_KEEP))
            while len(self.answers) > self.config.remember_answers:
                del self.answers[next(iter(self.answers))]
        req.shared_upto = end
        tokens = [SEPARATOR] + req.store.slice(start - context, end)
        scope, steps = self.budget.share(req.scope, len(tokens))
        for step in steps:
            if isinstance(step, Drop):
                step.scope.store = None
                continue
            if step.scope.store is None:
                step.scope.store = RefStore(0, True, self.config.orders, self.budget.key_bits)
            step.scope.store.resize(step.capacity)
        if scope.store is None:
            scope.store = RefStore(0, True, self.config.orders, self.budget.key_bits)
        scope.store.append(tokens)

    def draft(self, rid, context, budget: int, one_branch: bool = False) -> tuple[list, list, float]:
        req = self.requests[rid]
        history = self.history(req.scope) if req.share else None
        corpora = self.corpus_stores(req)
        # The group's latest other live requests (the same prompt in the same
        # scope: the samples of one RL prompt), read like the history.
        group = self.groups.get((req.scope, req.prompt), []) if req.share else []
        peers = [self.requests[r].store for r in reversed(group) if r != rid][:GROUP_PEERS]
        shared = [history] + peers + corpora if corpora or peers else history
        out = draft(req.store, shared, context, budget, one_branch, self.params)
        if req.answer is not None:
            tokens = follow_answer(req.answer, [int(t) for t in context], req.store.n - req.prompt_len, budget)
            if tokens is None:
                req.answer = None
            elif tokens:
                out = tokens, list(range(-1, len(tokens) - 1)), sum(0.9 ** (i + 1) for i in range(len(tokens)))
        return out


ANSWER_KEEP = 64  # answer tokens remembered per prompt
GROUP_PEERS = 3  # live requests of the same prompt a request drafts from


def follow_answer(answer: list, context: list, given: int, budget: int):
    """A prompt served before drafts the answer it got then while its output
    follows it.  ``answer``: the prompt's last token, then the answer's first
    ``ANSWER_KEEP`` tokens.  The next ``budget`` tokens after the longest
    start of the answer, ``given`` (the output held) to ``given + 16`` tokens
    long (a context may end in committed tokens not given yet), that the
    context ends in, behind the prompt's last token.  None: the output has
    parted from the answer or passed it (it is then forgotten)."""
    n = len(answer) - 1
    if given >= n:
        return None
    if not context:
        return []
    for k in range(min(given + 16, n - 1, len(context) - 1), given - 1, -1):
        if context[-k - 1:] == list(answer[:k + 1]):
            return list(answer[k + 1: k + 1 + budget])
    return None
