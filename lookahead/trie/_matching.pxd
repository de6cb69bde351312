# Where the context occurs (see _matching.pyx), as drafting (_drafting.pyx)
# calls it: the parameters both read, a found occurrence, the walk shared by
# a draft's shared stores, and the helpers both run inline (a .pxd's inline
# functions are compiled into each module that cimports it, so no hot path
# calls one through a pointer).

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.vector cimport vector

from lookahead.trie._native cimport MAX_ORDERS, NativeStore, __builtin_prefetch, chain_head_address, hash_step
from lookahead.trie._store cimport DraftState


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
    double anchor_pace     # ... only in a request whose pace is at least this (0: always)
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


# Once per store and draft each, through a pointer (cdef functions of
# another module): their inner loops are inline in _matching.pyx.
cdef int _gather(NativeStore* s, const int32_t* ctx, int ctx_len, const DraftParams* prm,
                 double store_weight, bint one_branch, vector[Candidate]& cands,
                 SharedWalk* sw) noexcept nogil
cdef void _anchor(NativeStore* s, const int32_t* ctx, int ctx_len, const DraftParams* prm,
                  double store_weight, vector[Candidate]& cands) noexcept nogil
cdef int _shared_match(NativeStore* const* shared, int nshared, const int32_t* ctx, int ctx_len,
                       const DraftParams* prm) noexcept nogil
cdef int _best_match(vector[Candidate]& cands) noexcept nogil
cdef void _follow_copy(NativeStore* s, const int32_t* ctx, int ctx_len, const DraftParams* prm,
                       double store_weight, DraftState* state, vector[Candidate]& cands,
                       NativeStore* const* shared, int nshared, int shared_m) noexcept nogil
