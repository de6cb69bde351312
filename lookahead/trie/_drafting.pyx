# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, nonecheck=False
"""Drafting: find the context in the token stores, weigh what is found, draft.

A draft for one request reads the request's own store (``_store.pyx``: its
prompt and output, the likeliest copy source) and its *shared* stores: its
scope's shared history and the external corpora it may draft from
(``lookahead.trie.corpora``), read in that order as one store.  In each, the occurrences of the context's longest suffixes are
gathered from the n-gram chains (``_gather``), each weighted by how far back
it matches the context, the own store's more; their continuations go into
the draft trie (``_draft_tree.pyx``), which chooses the draft.

Around that core, ways to keep a draft going where plain matching fails or
misleads, each a tunable of ``DraftParams`` (``lookahead.trie._tuning`` has the
values and the reasons):

* re-anchoring (``_anchor``): after an edit, find where the text before the
  divergence was copied from and resume the copy there;
* the copy cursor (``_follow_copy``): prefer the occurrence the previous
  draft was copying, advanced by what was accepted since;
* past one mismatch (in ``_gather``): an own-stream match goes on past an
  edited token, at a lower weight per token;
* wildcard paths (``_merge_past``): past tokens that match nothing, and, in
  a request that is not copying, as low-weight alternatives;
* own output over own prompt (``_weigh_output``), in a request that is not
  copying.

Whether a request is copying is read from its *pace*, the tokens it
advanced per draft (``DraftState``, kept with its store).

All of it runs without the GIL, one shared-lock hold per store, and a draft
never waits for a writer: a store being written at that instant is skipped.
"""

from libc.math cimport pow
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.vector cimport vector

from cpython.object cimport PyObject, PyTypeObject

from lookahead.trie._draft_tree cimport DraftTree, _merge, _reset, _select
from lookahead.trie._native cimport (
    MAX_ORDERS, NativeStore, __builtin_prefetch, chain_head, chain_head_address, hash_step, store_base,
)
from lookahead.trie._store cimport DraftState, TokenStore, _fresh_state, begin_draft, end_draft
from lookahead.trie._tokens cimport _read_tokens


cdef extern from "Python.h":
    PyTypeObject PyTuple_Type


cdef enum:
    # Most candidate occurrences gathered for one draft (scratch sizing).
    MAX_CANDIDATES_LIMIT = 256
    # In a frozen store's chain, the tokens of the occurrences this many
    # steps ahead are loaded while the current one is verified.
    FROZEN_AHEAD = 6

cdef uint32_t NO_CHAIN = 0xFFFFFFFF

cdef double PACE_DECAY = 0.8     # how much of its pace a request keeps at each draft (see _draft)


cdef struct DraftParams:
    int max_match          # longest suffix verified against an occurrence
    int max_walk           # chain steps per order and store
    int max_candidates     # occurrences merged into one draft
    int enough_candidates  # stop descending orders once this many are found
    double match_exponent  # weight of an occurrence = match_len ** match_exponent
    double local_weight    # the request's own stream counts this much more (trees)
    double chain_local_weight  # ... in one-branch drafts
    int min_match          # occurrences shorter than this are ignored
    double confidence      # pseudo-weight of unseen continuations (see _score_children in _draft_tree.pyx)
    double order_norm      # divide an occurrence's weight by (hits of its order) ** order_norm
    int top_walk           # chain steps for the highest order (long verbatim matches)
    int low_walk           # chain steps for orders <= 2 in the shared ring, multi-branch drafts only
    int anchor_window      # copy re-anchoring (see _anchor): source tokens searched, 0: off
    int anchor_below       # ... when the best local match is shorter than this
    int anchor_gap         # ... skipping at most this many diverged context tokens
    int anchor_min         # ... after a verified anchor match of at least this many
    double copy_boost      # weight multiplier of the copy being followed (see _follow_copy), 0: off
    double mismatch_weight # own-stream matches go on past one mismatch, each further token counting this much (0: off)
    int wildcard_tokens    # an unmatched context: draft past its last 1..this many tokens as if they were any (0: off)
    double wildcard_weight # ... and past its last token at this weight while the request's pace is below wildcard_pace
    double wildcard_pace
    int wildcard_walk      # ... gathered walking this many occurrences per order, stopping at as many
    double wildcard_below  # ... only while the direct matches weigh less than this in all
    double output_weight   # while the pace is below wildcard_pace: own-output occurrences weigh this much more than own-prompt ones
    double min_score       # nodes scoring below this are not drafted (_select)


cdef struct Candidate:
    int64_t pos
    int match
    double weight


cdef struct SharedWalk:
    # What the shared stores of one draft (its scope's history, then its
    # corpora) have gathered so far, per order index: they are read as one
    # store would be (see _gather).
    int walked[MAX_ORDERS]   # chain steps taken
    int found[MAX_ORDERS]    # occurrences gathered


cdef inline void _fresh_walk(SharedWalk* sw) noexcept nogil:
    cdef int o
    for o in range(MAX_ORDERS):
        sw.walked[o] = 0
        sw.found[o] = 0


cdef inline int _shared_found(const SharedWalk* sw, NativeStore* s, int o) noexcept nogil:
    # Occurrences the shared stores hold at order index o and above.
    cdef int so, total = 0
    for so in range(o, s.norders):
        total += sw.found[so]
    return total


cdef class DraftConfig:
    """The parameters of drafting, as the native code reads them: built by
    ``lookahead.trie._tuning.DraftTuning.native`` (which checks them), and passed
    to every draft."""
    cdef DraftParams p

    def __cinit__(self, *, int max_match_len, int max_walk, int max_candidates, int enough_candidates,
                  double match_exponent, double local_weight, double chain_local_weight, int min_match_len,
                  double confidence, double order_norm, int top_walk, int low_walk, int anchor_window,
                  int anchor_below, int anchor_gap, int anchor_min, double copy_boost, int wildcard_tokens,
                  double mismatch_weight, double wildcard_weight, double wildcard_pace, int wildcard_walk,
                  double output_weight, double wildcard_below, double min_score=0.0):
        self.p.max_match = max_match_len
        self.p.max_walk = max_walk
        self.p.max_candidates = min(max_candidates, MAX_CANDIDATES_LIMIT)
        self.p.enough_candidates = enough_candidates
        self.p.match_exponent = match_exponent
        self.p.local_weight = local_weight
        self.p.chain_local_weight = chain_local_weight
        self.p.min_match = min_match_len
        self.p.confidence = confidence
        self.p.order_norm = order_norm
        self.p.top_walk = top_walk
        self.p.low_walk = low_walk
        self.p.anchor_window = anchor_window
        self.p.anchor_below = anchor_below
        self.p.anchor_gap = anchor_gap
        self.p.anchor_min = anchor_min
        self.p.copy_boost = copy_boost
        self.p.wildcard_tokens = wildcard_tokens
        self.p.mismatch_weight = mismatch_weight
        self.p.wildcard_weight = wildcard_weight
        self.p.wildcard_pace = wildcard_pace
        self.p.wildcard_walk = wildcard_walk
        self.p.wildcard_below = wildcard_below
        self.p.output_weight = output_weight
        self.p.min_score = min_score

    @property
    def min_score(self):
        """Nodes scoring below this are not drafted; settable while drafts
        run (``LookaheadCache.min_score``: one double, read once per draft)."""
        return self.p.min_score

    @min_score.setter
    def min_score(self, double value):
        self.p.min_score = value


cdef inline double _powi(double base, double e) noexcept nogil:
    # match_len ** exponent; the common integer exponents skip libm.
    if e == 2.0:
        return base * base
    if e == 1.0:
        return base
    return pow(base, e)


cdef inline void _suffix_hashes(NativeStore* s, const int32_t* ctx, int ctx_len, uint64_t* hashes) noexcept nogil:
    # Each order's suffix of the context, hashed as _index_locked (_store.pyx)
    # hashes n-grams (0 for an order longer than the context).
    cdef uint64_t h = 0
    cdef int o, j, k, prev_k = 0
    for o in range(s.norders):
        k = s.orders[o]
        if k > ctx_len:
            hashes[o] = 0
            continue
        for j in range(prev_k, k):
            h = hash_step(h, ctx[ctx_len - 1 - j])
        prev_k = k
        hashes[o] = h


cdef inline void _prefetch_heads(NativeStore* s, const int32_t* ctx, int ctx_len, bint past_last) noexcept nogil:
    # Start loading the chain head of every order's suffix at once, and of
    # the suffixes ending one token earlier if ``past_last`` (must hold
    # s.mtx): each is a cache miss in a large store, which the gathers would
    # otherwise wait for one at a time.
    cdef uint64_t hashes[MAX_ORDERS]
    cdef int o, shift = 64 - s.hbits
    if s.n_indexed == 0:
        return
    _suffix_hashes(s, ctx, ctx_len, hashes)
    for o in range(s.norders):
        if s.orders[o] <= ctx_len:
            __builtin_prefetch(chain_head_address(s, o, <uint32_t>(hashes[o] >> shift)))
    if past_last and ctx_len > 1:
        _prefetch_heads(s, ctx, ctx_len - 1, False)


cdef inline void _prefetch_frozen(NativeStore* s, const uint64_t* hashes, int ctx_len,
                                  const DraftParams* prm) noexcept nogil:
    # A frozen store's chains (see ``frozen`` in _native.hpp) start with two
    # dependent loads each, the first position and then its token: issue
    # them for every order at once, in two rounds, rather than one order
    # after the other (must hold s.mtx; the chain heads were prefetched).
    cdef int o, shift = 64 - s.hbits
    cdef uint32_t first[MAX_ORDERS]
    cdef uint32_t slot
    for o in range(s.norders):
        first[o] = NO_CHAIN
        if s.frozen >> o & 1 and s.orders[o] <= ctx_len and s.orders[o] >= prm.min_match:
            slot = <uint32_t>(hashes[o] >> shift)
            if s.cstart[o][slot] < s.cstart[o][slot + 1]:
                first[o] = s.cstart[o][slot]
                __builtin_prefetch(&s.occ[o][first[o]])
    for o in range(s.norders):
        if first[o] != NO_CHAIN:
            __builtin_prefetch(&s.tok[s.occ[o][first[o]] & s.mask])


cdef inline int64_t _latest(NativeStore* s, int o, uint64_t h) noexcept nogil:
    # The latest position whose order-``o`` n-gram hashes to ``h``'s slot
    # (the head of its chain; must hold s.mtx), or -1.  Heads hold
    # (position + 1) mod 2**32, see _index_locked.
    cdef uint32_t e = chain_head(s, o, <uint32_t>(h >> (64 - s.hbits)))
    cdef int64_t n = s.n
    if e == 0:
        return -1
    return n - 1 - <int64_t>(<uint32_t>(<uint32_t>n - e))


cdef inline int64_t _chain_start(NativeStore* s, int o, const uint64_t* hashes, int ctx_len,
                                 const DraftParams* prm) noexcept nogil:
    # The latest occurrence of the context's order-``o`` suffix (a chain's
    # first position; must hold s.mtx), or -1: none, or the order is unused.
    if s.orders[o] > ctx_len or s.orders[o] < prm.min_match:
        return -1
    return _latest(s, o, hashes[o])


cdef inline int _walk_limit(NativeStore* s, int o, const DraftParams* prm, bint one_branch) noexcept nogil:
    # Occurrences visited on order o's chain (see _gather's docstring).
    cdef int walk = prm.max_walk
    if o == s.norders - 1 and prm.top_walk > walk and not s.ring:
        walk = prm.top_walk
    if s.orders[o] <= 2 and not one_branch and prm.low_walk > walk and s.ring:
        walk = prm.low_walk
    return walk


cdef int _gather(NativeStore* s, const int32_t* ctx, int ctx_len, const DraftParams* prm,
                 double store_weight, bint one_branch, vector[Candidate]& cands,
                 SharedWalk* sw) noexcept nogil:
    """Collect occurrences of the context's longest suffixes in one store.

    Must be called with ``s.mtx`` held.  Orders are tried from the longest
    down; an occurrence found at a higher order is not added again.  The
    highest order may walk further in a request's own store (``top_walk``:
    in repetitive text the right copy source is not always among the few
    most recent; the shared ring gains nothing from it), and orders 1 and 2
    may walk further in the shared ring for a multi-branch draft
    (``low_walk``: better frequency estimates for its alternatives, from
    everyone's history; a request's own short contexts are mostly noise, and
    a chain only wants the heaviest one).

    ``sw`` (the shared stores; NULL for a request's own store): a request's
    shared stores, its scope's history and then its corpora, are read as one
    store holding them all would be: an order's chain walk goes on into the
    next store with the steps the previous ones left, and the descent to
    shorter suffixes stops once the shared stores together hold
    ``enough_candidates`` at the orders tried.  So the first shared store is
    read as it would be alone, and a corpus adds what the history lacks:
    long matches, and short ones only where the history has few (a 10M-token
    corpus would otherwise walk every short context's long chains, each step
    a cache miss, for matches of weight 1).
    """
    cdef int o, k, m, beyond, steps, found = 0, walk, so, j, nscouts
    cdef int scout_order[MAX_ORDERS]
    cdef int scout_walk[MAX_ORDERS]
    cdef int64_t scout_q[MAX_ORDERS]
    cdef uint32_t d, sd
    cdef int64_t q, sq, base = store_base(s)
    cdef int64_t n = s.n
    cdef int32_t t
    cdef int max_match = prm.max_match if prm.max_match < ctx_len else ctx_len
    cdef size_t c
    cdef bint dup
    cdef int start_count = <int>cands.size()
    cdef uint64_t hashes[MAX_ORDERS]
    cdef Candidate cand
    cdef size_t order_start
    cdef double scale
    cdef int total
    cdef bint laid_out
    cdef uint32_t ci = 0, cend = 0, slot, a

    if s.n_indexed == 0 or ctx_len == 0:
        return 0
    _suffix_hashes(s, ctx, ctx_len, hashes)
    if s.frozen:
        _prefetch_frozen(s, hashes, ctx_len, prm)
    o = s.norders - 1
    while o >= 0:
        k = s.orders[o]
        q = _chain_start(s, o, hashes, ctx_len, prm)
        if q < 0:
            # (The shared stores before this one may hold enough at this order.)
            if sw != NULL and _shared_found(sw, s, o) >= prm.enough_candidates:
                break
            o -= 1
            continue
        order_start = cands.size()
        walk = _walk_limit(s, o, prm, one_branch)
        if sw != NULL:
            walk -= sw.walked[o]
        # Scouts walk the chains of the lower orders, which are walked next
        # if this one finds too few, a step per step of this walk: each
        # step is a cache miss in a large store, and independent chains
        # wait for memory at the same time.  They only read, so what is
        # gathered does not change.
        # A frozen order's chain is an array (see ``frozen`` in _native.hpp):
        # the tokens of its first occurrences are loaded at once.
        laid_out = s.frozen >> o & 1
        if laid_out:
            slot = <uint32_t>(hashes[o] >> (64 - s.hbits))
            ci = s.cstart[o][slot]
            cend = s.cstart[o][slot + 1]
            for a in range(ci + 1, min(cend, ci + 1 + FROZEN_AHEAD)):
                __builtin_prefetch(&s.tok[s.occ[o][a] & s.mask])
        nscouts = 0
        for so in range(o - 1, -1, -1):
            if s.frozen >> so & 1:
                continue   # (its chain is an array: nothing to scout)
            sq = _chain_start(s, so, hashes, ctx_len, prm)
            if sq >= 0:
                scout_order[nscouts] = so
                scout_q[nscouts] = sq
                scout_walk[nscouts] = _walk_limit(s, so, prm, one_branch)
                if sw != NULL:
                    scout_walk[nscouts] -= sw.walked[so]
                nscouts += 1
        steps = 0
        while q >= base and q < s.n_indexed and steps < walk:
            # The link to the next occurrence, loaded while the match is verified.
            if not laid_out:
                __builtin_prefetch(&s.prev[o][q & s.mask])
            for j in range(nscouts):
                sq = scout_q[j]
                if sq >= base and sq < s.n_indexed and steps < scout_walk[j]:
                    __builtin_prefetch(&s.tok[sq & s.mask])
                    sd = s.prev[scout_order[j]][sq & s.mask]
                    scout_q[j] = sq - sd if sd != 0 else -1
            steps += 1
            # Verify the match and measure how far back it goes.
            m = 0
            while m < max_match and q - m >= base:
                t = s.tok[(q - m) & s.mask]
                if t != ctx[ctx_len - 1 - m]:
                    break
                m += 1
            # In the request's own stream, a match goes on past one mismatch
            # (an edited name or number); what it matches there counts
            # mismatch_weight per token.
            beyond = 0
            if prm.mismatch_weight > 0 and not s.ring and m >= k and m < max_match and q - m >= base \
                    and s.tok[(q - m) & s.mask] >= 0:
                while m + 1 + beyond < max_match and q - m - 1 - beyond >= base:
                    t = s.tok[(q - m - 1 - beyond) & s.mask]
                    if t < 0 or t != ctx[ctx_len - 2 - m - beyond]:
                        break
                    beyond += 1
            # An occurrence needs a continuation: skip the stream's last token
            # (that is the context itself) and tokens before a separator.
            if m >= k and q + 1 < n and s.tok[(q + 1) & s.mask] >= 0:
                # Only a match as long as the next higher order can have
                # been found already, by that order's walk.
                dup = False
                if o + 1 < s.norders and m >= s.orders[o + 1]:
                    for c in range(start_count, cands.size()):
                        if cands[c].pos == q:
                            dup = True
                            break
                if not dup:
                    cand.pos = q
                    cand.match = m
                    cand.weight = store_weight * _powi(m + prm.mismatch_weight * beyond, prm.match_exponent)
                    cands.push_back(cand)
                    found += 1
                    if <int>cands.size() >= prm.max_candidates:
                        break
            if laid_out:
                ci += 1
                if ci >= cend:
                    break
                if ci + FROZEN_AHEAD < cend:
                    __builtin_prefetch(&s.tok[s.occ[o][ci + FROZEN_AHEAD] & s.mask])
                q = s.occ[o][ci]
                continue
            d = s.prev[o][q & s.mask]
            if d == 0:
                break
            q -= d
        if prm.order_norm > 0 and <int>cands.size() > order_start:
            scale = pow(<double>(<int>cands.size() - order_start), -prm.order_norm)
            for c in range(order_start, cands.size()):
                cands[c].weight *= scale
        total = found
        if sw != NULL:
            sw.walked[o] += steps
            sw.found[o] += <int>(cands.size() - order_start)
            total = _shared_found(sw, s, o)
        if total >= prm.enough_candidates or <int>cands.size() >= prm.max_candidates:
            break
        o -= 1
    return found


cdef void _anchor(NativeStore* s, const int32_t* ctx, int ctx_len, const DraftParams* prm,
                  double store_weight, vector[Candidate]& cands) noexcept nogil:
    """Copy re-anchoring after an edit (call right after gathering ``s``, the
    request's own stream, which ``ctx`` ends; must hold ``s.mtx``).

    When the context's best match in its own stream is short, the output has
    probably just diverged from a text it was copying: a token replaced, a
    line inserted or deleted, a quote that skips a sentence.  Find where the
    context *before* its last ``o`` tokens was copied from (the smallest ``o``
    whose ``K``-gram, K the highest order, has an earlier occurrence verified
    over ``anchor_min`` tokens), then look in the ``anchor_window`` tokens
    after that anchor for the occurrence that best matches the context's last
    ``o`` tokens (longest match, then nearest to where an equal-length edit
    would put it): the copy most likely resumes there, so it becomes a
    candidate weighted as a match of anchor + tail length."""
    cdef int m_best = 0, o = 0, K, steps, am, best_am = 0, mq, best_mq = 0
    cdef size_t c
    cdef int64_t q, r = -1, end, best_q = -1, dist, best_dist = 0
    cdef int64_t base = store_base(s)
    cdef int top = s.norders - 1
    cdef uint64_t hashes[MAX_ORDERS]
    cdef uint32_t d
    cdef Candidate cand
    for c in range(cands.size()):
        if cands[c].match > m_best:
            m_best = cands[c].match
    if m_best >= prm.anchor_below or s.n_indexed < s.n:
        return
    K = s.orders[top]
    for o in range(1, prm.anchor_gap + 1):
        if o + K > ctx_len:
            return
        # The K-gram ending o tokens before the context's end.
        _suffix_hashes(s, ctx, ctx_len - o, hashes)
        q = _latest(s, top, hashes[top])
        if q < 0:
            continue
        steps = 0
        best_am = 0
        while q >= base and steps < 8:
            steps += 1
            if q < s.n - 1 - o:   # not the context's own position
                am = 0
                while am < ctx_len - o and am < 64 and q - am >= base:
                    if s.tok[(q - am) & s.mask] != ctx[ctx_len - 1 - o - am]:
                        break
                    am += 1
                if am > best_am:
                    best_am = am
                    r = q
            d = s.prev[top][q & s.mask]
            if d == 0:
                break
            q -= d
        if best_am >= K and best_am >= prm.anchor_min:
            break
        r = -1
    if r < 0:
        return
    end = r + 1 + prm.anchor_window
    if end > s.n - 1:
        end = s.n - 1
    q = r + 1
    while q < end:
        mq = 0
        while mq < o and q - mq >= base and s.tok[(q - mq) & s.mask] == ctx[ctx_len - 1 - mq]:
            mq += 1
        if mq > 0 and s.tok[(q + 1) & s.mask] >= 0:
            dist = q - (r + o)
            if dist < 0:
                dist = -dist
            if mq > best_mq or (mq == best_mq and dist < best_dist):
                best_mq = mq
                best_q = q
                best_dist = dist
        q += 1
    if best_q < 0:
        return
    cand.pos = best_q
    cand.match = best_mq + best_am
    cand.weight = store_weight * _powi(<double>cand.match, prm.match_exponent)
    for c in range(cands.size()):
        if cands[c].pos == best_q:
            cands[c] = cand
            return
    cands.push_back(cand)


cdef void _follow_copy(NativeStore* s, const int32_t* ctx, int ctx_len, const DraftParams* prm,
                       double store_weight, DraftState* state, vector[Candidate]& cands) noexcept nogil:
    """Prefer the copy being followed (call after gathering ``s``, the
    request's own stream, which ``ctx`` ends; must hold ``s.mtx``).

    Text that is copied (a file being edited, a quoted document) often
    repeats inside its source: the same line in several methods, the same
    phrase in several paragraphs.  Then several occurrences match the context
    equally far back, and their summed weight can outvote the one the output
    is actually copying.  The previous draft's heaviest occurrence tells
    where that copy is; advanced by the tokens accepted since, it is where
    the copy goes on if it did.  When that position matches the context at
    least as far back as every other occurrence, its weight is multiplied by
    ``copy_boost``.  A draft repeated on an unchanged stream looks at the
    same position again, so it gives the same draft.
    """
    cdef int64_t n = s.n
    cdef int64_t q = -1
    cdef int m = 0, m_best = 0
    cdef size_t c
    cdef Candidate cand
    cdef double heaviest = -1.0
    if n == state.n:
        q = state.used
    elif state.src >= 0 and n > state.n:
        q = state.src + (n - state.n)
    state.used = q   # (state.n is advanced by the caller, _draft)
    if q >= 0 and q + 1 < n and s.tok[(q + 1) & s.mask] >= 0:
        while m < prm.max_match and m < ctx_len and q - m >= 0 and s.tok[(q - m) & s.mask] == ctx[ctx_len - 1 - m]:
            m += 1
        for c in range(cands.size()):
            if cands[c].match > m_best:
                m_best = cands[c].match
        if m > 0 and m >= m_best:
            for c in range(cands.size()):
                if cands[c].pos == q:
                    cands[c].weight *= prm.copy_boost
                    break
            else:
                cand.pos = q
                cand.match = m
                cand.weight = prm.copy_boost * store_weight * _powi(<double>m, prm.match_exponent)
                cands.push_back(cand)
    state.src = -1
    for c in range(cands.size()):
        if cands[c].weight > heaviest:
            heaviest = cands[c].weight
            state.src = cands[c].pos


cdef inline bint _not_copying(const DraftParams* prm, const DraftState* state) noexcept nogil:
    # A request advancing slowly (its pace below wildcard_pace) is writing,
    # not copying: the wildcard alternatives and the output weight apply.
    return state.pace < prm.wildcard_pace


cdef void _weigh_output(const DraftParams* prm, const DraftState* state, vector[Candidate]& cands) noexcept nogil:
    """A request that is not copying (chat, fresh code) repeats its own
    answer more than it quotes its prompt: its lists, names and phrasing
    recur.  So there its occurrences in its own output weigh
    ``output_weight`` times those in its prompt (call with ``cands`` holding
    the request's own occurrences only).  In a request that is copying, the
    prompt is the source and keeps its weight."""
    cdef size_t c
    if prm.output_weight == 1.0 or state.prompt_end < 0 or not _not_copying(prm, state):
        return
    for c in range(cands.size()):
        if cands[c].pos >= state.prompt_end:
            cands[c].weight *= prm.output_weight

cdef inline bint _wants_alternatives(const DraftParams* prm, const DraftState* state, int ctx_len) noexcept nogil:
    # Merge the wildcard alternatives (see _draft): a slowly advancing request.
    return prm.wildcard_weight > 0 and _not_copying(prm, state) and ctx_len > 1


cdef double _draft(NativeStore* local, NativeStore* const* shared, int nshared,
                   const int32_t* ctx, int ctx_len, int budget, bint one_branch,
                   const DraftParams* prm, DraftState* state, vector[Candidate]& cands,
                   DraftTree& tree, vector[int32_t]& frontier,
                   vector[int32_t]& out_tokens, vector[int32_t]& out_parents) noexcept nogil:
    """Draft into ``out_tokens`` / ``out_parents``; returns the draft's expected
    accepted tokens (``_select``)."""
    cdef size_t c
    cdef int depth = budget
    # A chain bets on one continuation, and the request's own text is the
    # likelier single one; a tree also wants the shared alternatives.
    cdef double local_weight = prm.chain_local_weight if one_branch else prm.local_weight
    cands.clear()
    _reset(tree)
    # One shared-lock hold per store: gather its occurrences and merge them.
    # A store that a writer holds at this instant (the inserter indexing a
    # prompt or a share, for at most one 32-position chunk) is skipped rather
    # than waited for; after synchronize() no writer holds one, so drafts
    # stay deterministic.
    if local != NULL and local.mtx.try_lock_shared():
        if state.n >= 0 and local.n > state.n:
            state.pace = PACE_DECAY * state.pace + (1.0 - PACE_DECAY) * <double>(local.n - state.n)
        _prefetch_heads(local, ctx, ctx_len, _wants_alternatives(prm, state, ctx_len))
        _gather(local, ctx, ctx_len, prm, local_weight, one_branch, cands, NULL)
        if prm.anchor_window > 0:
            _anchor(local, ctx, ctx_len, prm, local_weight, cands)
        if prm.copy_boost > 0:
            _follow_copy(local, ctx, ctx_len, prm, local_weight, state, cands)
        _weigh_output(prm, state, cands)
        state.n = local.n
        for c in range(cands.size()):
            _merge(local, cands[c].pos, cands[c].weight, depth, tree)
        local.mtx.unlock_shared()
    # The shared stores (the scope's history, then any corpora) in turn, read
    # as one store (see _gather), weighted 1.0, while fewer than
    # max_candidates occurrences are held.
    cdef size_t first_shared
    cdef int si
    cdef NativeStore* sh
    cdef SharedWalk sw
    _fresh_walk(&sw)
    if nshared > 1:
        # Several stores (a history and corpora, or a corpus in pieces): the
        # chain heads of all of them are loaded at once.
        for si in range(nshared):
            sh = shared[si]
            if sh != NULL and sh.mtx.try_lock_shared():
                _prefetch_heads(sh, ctx, ctx_len, False)
                sh.mtx.unlock_shared()
    for si in range(nshared):
        sh = shared[si]
        if sh == NULL or <int>cands.size() >= prm.max_candidates or not sh.mtx.try_lock_shared():
            continue
        first_shared = cands.size()
        _prefetch_heads(sh, ctx, ctx_len, _wants_alternatives(prm, state, ctx_len))
        _gather(sh, ctx, ctx_len, prm, 1.0, one_branch, cands, &sw)
        for c in range(first_shared, cands.size()):
            _merge(sh, cands[c].pos, cands[c].weight, depth, tree)
        sh.mtx.unlock_shared()
    # Nothing matched: the context ends in a token never seen before (a new
    # name, a rare word piece).  What follows it is often what followed the
    # tokens before it elsewhere, whatever came in between.  A request whose
    # drafts have been advancing it slowly (its pace: chat, fresh code) is
    # not copying, and there that evidence also helps when the last token did
    # match, at a small weight; in a request that is copying it would only
    # take slots from the copy.  Nor are they gathered when the direct matches
    # are heavy (a long match): at their low weight they would rank below all
    # of its nodes, and gathering them is a good part of a draft's cost.
    cdef int skip = 1
    cdef DraftParams fill   # a cheap gather: these alternatives only fill spare slots
    if tree.nodes[0].head >= 0:
        if _wants_alternatives(prm, state, ctx_len) and tree.nodes[0].weight < prm.wildcard_below:
            fill = prm[0]
            fill.max_walk = fill.enough_candidates = prm.wildcard_walk
            fill.top_walk = fill.low_walk = 0
            _merge_past(local, shared, nshared, ctx, ctx_len, 1, depth, one_branch, &fill,
                        local_weight * prm.wildcard_weight, prm.wildcard_weight, cands, tree)
    else:
        while tree.nodes[0].head < 0 and skip <= prm.wildcard_tokens and skip < ctx_len:
            _merge_past(local, shared, nshared, ctx, ctx_len, skip, depth, one_branch, prm, local_weight, 1.0,
                        cands, tree)
            skip += 1
    return _select(tree, budget, one_branch, prm.confidence, prm.min_score, frontier, out_tokens, out_parents)


cdef void _merge_past(NativeStore* local, NativeStore* const* shared, int nshared, const int32_t* ctx,
                      int ctx_len, int skip, int depth, bint one_branch, const DraftParams* prm,
                      double local_weight, double shared_weight, vector[Candidate]& cands,
                      DraftTree& tree) noexcept nogil:
    """:func:`_gather_past` on the request's store, then on each shared
    store (read as one, see _gather) while fewer than ``max_candidates``
    occurrences are held."""
    cdef int si
    cdef NativeStore* sh
    cdef SharedWalk sw
    _fresh_walk(&sw)
    cands.clear()
    if local != NULL and local.mtx.try_lock_shared():
        _gather_past(local, ctx, ctx_len, skip, prm, local_weight, one_branch, depth, cands, tree, NULL)
        local.mtx.unlock_shared()
    for si in range(nshared):
        sh = shared[si]
        if sh == NULL or <int>cands.size() >= prm.max_candidates or not sh.mtx.try_lock_shared():
            continue
        _gather_past(sh, ctx, ctx_len, skip, prm, shared_weight, one_branch, depth, cands, tree, &sw)
        sh.mtx.unlock_shared()


cdef void _gather_past(NativeStore* s, const int32_t* ctx, int ctx_len, int skip, const DraftParams* prm,
                       double store_weight, bint one_branch, int depth, vector[Candidate]& cands,
                       DraftTree& tree, SharedWalk* sw) noexcept nogil:
    """Merge the continuations of the context's suffixes that end ``skip``
    tokens before its end, each ``skip`` tokens further on: a draft past
    tokens that match nothing (must hold ``s.mtx``).  An occurrence is
    dropped when a separator falls within the skipped tokens."""
    cdef size_t first = cands.size()
    cdef size_t c
    cdef int j
    cdef bint whole
    _gather(s, ctx, ctx_len - skip, prm, store_weight, one_branch, cands, sw)
    for c in range(first, cands.size()):
        whole = True
        for j in range(1, skip + 1):
            if cands[c].pos + j >= s.n or s.tok[(cands[c].pos + j) & s.mask] < 0:
                whole = False
                break
        if whole:
            cands[c].pos += skip
            _merge(s, cands[c].pos, cands[c].weight, depth, tree)


cdef class Drafter:
    """Reusable scratch space for drafting; one per thread of callers.

    Drafts are returned as ``result_type`` instances, a tuple subclass of
    (tokens, parents, expected) such as ``lookahead.trie.cache.Draft``, built here:
    a namedtuple's Python-level constructor would cost more than the rest of
    a batch's glue."""
    cdef object result_type
    cdef vector[Candidate] cands
    cdef DraftTree tree
    cdef vector[int32_t] frontier
    cdef vector[int32_t] out_tokens
    cdef vector[int32_t] out_parents
    cdef vector[int32_t] ctx
    cdef vector[NativeStore*] shared_ptrs
    cdef public int64_t drafts, drafted   # counters for stats()

    def __cinit__(self, type result_type):
        if not issubclass(result_type, tuple):
            raise TypeError(f"result_type must be a tuple subclass, got {result_type!r}")
        self.result_type = result_type

    cdef object _result(self, list tokens, list parents, double expected):
        # tuple.__new__(result_type, (tokens, parents, expected)), without a Python call
        cdef tuple args = ((tokens, parents, expected),)
        return PyTuple_Type.tp_new(self.result_type, <PyObject*>args, NULL)

    def draft_context(self, TokenStore local, object shared, object context, int budget,
                      bint one_branch, DraftConfig config, int64_t max_id):
        """:meth:`draft` after a whole context (list or int array): only its
        last ``max_match`` ids (``anchor_gap + anchor_min + 32`` if more, for
        re-anchoring) are read and checked.  ``shared``: a ``TokenStore``
        (the scope's history), None, or a tuple or list of them (the history
        and the corpora the request may draft from), read in that order."""
        return self._draft_one(local, shared, context, budget, one_branch, config, max_id)

    cdef object _draft_one(self, TokenStore local, object shared, object context, int budget,
                          bint one_branch, DraftConfig config, int64_t max_id):
        # draft_context's body: a C call for draft_batch, no Python call per request.
        cdef int tail = config.p.max_match
        if config.p.anchor_window > 0 and tail < config.p.anchor_gap + config.p.anchor_min + 32:
            tail = config.p.anchor_gap + config.p.anchor_min + 32
        _read_tokens(context, tail, max_id, self.ctx, "context")
        if self.ctx.size() == 0 or budget <= 0:
            return self._result([], [], 0.0)
        cdef NativeStore* local_s = local.s if local is not None else NULL
        cdef TokenStore one
        self.shared_ptrs.clear()
        if shared is None:
            pass
        elif type(shared) is tuple or type(shared) is list:
            for item in shared:
                if item is not None:
                    one = <TokenStore?>item
                    self.shared_ptrs.push_back(one.s)
        else:
            one = <TokenStore?>shared
            self.shared_ptrs.push_back(one.s)
        # The request's draft state goes in and out by value, under the GIL.
        cdef DraftState state
        cdef double expected
        _fresh_state(&state)
        if local is not None:
            state = local.draft_state
        with nogil:
            begin_draft()
            expected = _draft(local_s, self.shared_ptrs.data(), <int>self.shared_ptrs.size(),
                              self.ctx.data(), self.ctx.size(), budget,
                              one_branch, &config.p, &state, self.cands, self.tree,
                              self.frontier, self.out_tokens, self.out_parents)
            end_draft()
        if local is not None:
            local.draft_state = state
        self.drafts += 1
        self.drafted += self.out_tokens.size()
        return self._result(list(self.out_tokens), list(self.out_parents), expected)

    def draft_batch(self, list locals_, list shareds, list contexts, int budget,
                    bint one_branch, DraftConfig config, int64_t max_id):
        """:meth:`draft_context` for many requests, in a list: request i
        drafts from ``locals_[i]`` and ``shareds[i]`` (its scope's history,
        or None, or a tuple of it and corpora: see :meth:`draft_context`)."""
        cdef Py_ssize_t i
        out = []
        begin_draft()   # the whole batch, glue included, has priority over indexing
        try:
            for i in range(len(contexts)):
                out.append(self._draft_one(locals_[i], shareds[i], contexts[i], budget,
                                           one_branch, config, max_id))
        finally:
            end_draft()
        return out
