# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, nonecheck=False
"""Matching: where the context occurs in a token store.

A draft (``_drafting.pyx``) asks one question of each store it reads: where
does the text ending the context occur, how far back does each occurrence
match, and how much does it count?  The answers are candidate occurrences
(``Candidate``: a position whose continuation may be drafted, and its
weight); what drafting then does with them (the request's pace, the output
weight, the wildcard paths past unmatched tokens, the draft trie) does not
depend on how they were found.  This module is the finding:

* ``_gather``: the occurrences of the context's longest suffixes, walked on
  the n-gram chains of ``_store.pyx`` (linked, or laid out once frozen),
  each weighted by how far back it matches, an own-stream match going on
  past one mismatch; a request's shared stores are walked as one store;
* ``_anchor``: re-anchoring after an edit: find where the text before the
  divergence was copied from and resume the copy there;
* ``_follow_copy``: the copy cursor: prefer the occurrence the previous
  draft was copying, advanced by what was accepted since.

It is the hot path of drafting: every chain step is a cache miss in a large
store, so the walks prefetch the next links, scout the lower orders' chains
and load a frozen chain's tokens ahead.  All of it runs without the GIL,
under the shared lock of the store it reads (taken by the caller).  The
structs, and the helpers that drafting calls too, are in ``_matching.pxd``.
"""

from libc.math cimport pow
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.vector cimport vector

from lookahead.trie._native cimport MAX_ORDERS, NativeStore, __builtin_prefetch, chain_head, store_base
from lookahead.trie._store cimport DraftState


cdef enum:
    # In a frozen store's chain, the tokens of the occurrences this many
    # steps ahead are loaded while the current one is verified.
    FROZEN_AHEAD = 6

cdef uint32_t NO_CHAIN = 0xFFFFFFFF


cdef inline int _shared_found(const SharedWalk* sw, NativeStore* s, int o) noexcept nogil:
    # Occurrences the shared stores hold at order index o and above.
    cdef int so, total = 0
    for so in range(o, s.norders):
        total += sw.found[so]
    return total


cdef inline double _powi(double base, double e) noexcept nogil:
    # match_len ** exponent; the common integer exponents skip libm.
    if e == 2.0:
        return base * base
    if e == 1.0:
        return base
    return pow(base, e)


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


cdef int _shared_match(NativeStore* const* shared, int nshared, const int32_t* ctx, int ctx_len,
                       const DraftParams* prm) noexcept nogil:
    """How far back the request's shared stores match the context at best:
    the longest match among the first ``max_walk`` occurrences of its
    highest-order suffix in each (0: none that long).  Called with the
    request's own store locked, before its candidates are merged, where a
    guess or a preference about the own store must give way to an exact
    match found elsewhere (see ``_draft``)."""
    cdef int si, best = 0
    cdef size_t c
    cdef NativeStore* sh
    cdef DraftParams probe
    cdef vector[Candidate] found
    probe = prm[0]
    probe.top_walk = probe.low_walk = 0
    probe.enough_candidates = 1
    probe.max_candidates = 4
    probe.mismatch_weight = 0.0
    for si in range(nshared):
        sh = shared[si]
        if sh == NULL or sh.norders == 0 or not sh.mtx.try_lock_shared():
            continue
        probe.min_match = sh.orders[sh.norders - 1]
        found.clear()
        _gather(sh, ctx, ctx_len, &probe, 1.0, False, found, NULL)
        sh.mtx.unlock_shared()
        for c in range(found.size()):
            if found[c].match > best:
                best = found[c].match
    return best


cdef int _best_match(vector[Candidate]& cands) noexcept nogil:
    cdef int best = 0
    cdef size_t c
    for c in range(cands.size()):
        if cands[c].match > best:
            best = cands[c].match
    return best


cdef void _follow_copy(NativeStore* s, const int32_t* ctx, int ctx_len, const DraftParams* prm,
                       double store_weight, DraftState* state, vector[Candidate]& cands,
                       NativeStore* const* shared, int nshared, int shared_m) noexcept nogil:
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
    ``copy_boost``.  Every other occurrence includes the shared stores'
    (``shared_m``, their best match, probed here with ``_shared_match`` if
    the caller has not): a request asked again follows its earlier answer,
    which matches the context further back than the prompt text both copy
    from, and the boost must not hand the prompt the lead where the answer
    left it.  A draft repeated on an unchanged stream looks at the same
    position again, so it gives the same draft.
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
        if m > 0 and m >= m_best and nshared > 0 and shared_m < 0:
            shared_m = _shared_match(shared, nshared, ctx, ctx_len, prm)
        if m > 0 and m >= m_best and m >= shared_m:
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
