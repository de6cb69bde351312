# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, nonecheck=False
"""Drafting: weigh what is found of the context in the token stores, draft.

A draft for one request reads the request's own store (``_store.pyx``: its
prompt and output, the likeliest copy source) and its *shared* stores: its
scope's shared history and the external corpora it may draft from
(``lookahead.trie.corpora``), read in that order as one store.  In each,
``_matching.pyx`` finds where the context occurs (``_gather``: the
occurrences of its longest suffixes, each weighted by how far back it
matches, the own store's more); here those occurrences are weighed for the
request at hand and their continuations go into the draft trie
(``_draft_tree.pyx``), which chooses the draft.  This module holds the
draft's course, store by store under each one's lock, and what depends on
the request rather than on the text: it is where a draft's state lives.

Around that core, ways to keep a draft going where plain matching fails or
misleads, each a tunable of ``DraftParams`` (``lookahead.trie._tuning`` has the
values and the reasons):

* re-anchoring (``_anchor`` in ``_matching.pyx``): after an edit, find where
  the text before the divergence was copied from and resume the copy there;
* the copy cursor (``_follow_copy`` in ``_matching.pyx``): prefer the
  occurrence the previous draft was copying, advanced by what was accepted
  since;
* past one mismatch (in ``_gather``): an own-stream match goes on past an
  edited token, at a lower weight per token;
* wildcard paths (``_merge_past``, here): past tokens that match nothing,
  and, in a request that is not copying, as low-weight alternatives;
* own output over own prompt (``_weigh_output``, here), in a request that is
  not copying.

Whether a request is copying is read from its *pace*, the tokens it
advanced per draft (``DraftState``, kept with its store).

All of it runs without the GIL, one shared-lock hold per store, and a draft
never waits for a writer: a store being written at that instant is skipped.
"""

from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from cpython.object cimport PyObject, PyTypeObject

from lookahead.trie._draft_tree cimport DraftTree, _merge, _reset, _select
from lookahead.trie._inserter cimport begin_draft, end_draft
from lookahead.trie._matching cimport (
    Candidate, DraftParams, SharedWalk, _anchor, _best_match, _follow_copy, _fresh_walk, _gather,
    _prefetch_heads, _shared_match,
)
from lookahead.trie._native cimport NativeStore
from lookahead.trie._store cimport DraftState, TokenStore, _fresh_state
from lookahead.trie._tokens cimport _read_tokens


cdef extern from "Python.h":
    PyTypeObject PyTuple_Type


cdef enum:
    # Most candidate occurrences gathered for one draft (scratch sizing).
    MAX_CANDIDATES_LIMIT = 256

cdef double PACE_DECAY = 0.8     # how much of its pace a request keeps at each draft (see _draft)


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
                  double output_weight, double wildcard_below, double anchor_pace, double min_score=0.0):
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
        self.p.anchor_pace = anchor_pace
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
                   vector[int32_t]& out_tokens, vector[int32_t]& out_parents,
                   vector[double]& out_scores) noexcept nogil:
    """Draft into ``out_tokens`` / ``out_parents`` / ``out_scores``; returns the
    draft's expected accepted tokens (``_select``)."""
    cdef size_t c
    cdef int depth = budget
    # A chain bets on one continuation, and the request's own text is the
    # likelier single one; a tree also wants the shared alternatives.
    cdef double local_weight = prm.chain_local_weight if one_branch else prm.local_weight
    cdef int shared_m
    cdef bint anchoring
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
        # An exact match in the shared stores (the earlier answer to a
        # request asked again, say) outranks the own store's guesses: a
        # re-anchored copy (a guess past diverged tokens) gives way to one at
        # least anchor_min long, the copy being followed is only boosted if no
        # shared occurrence matches further back (_shared_match; -1: not probed yet).
        # Re-anchoring also waits for a request that is copying (its pace):
        # in one writing fresh text (an agent's next step after a tool's
        # output, whose prompt is full of boilerplate and earlier turns) a
        # short own match is no diverged copy, and a re-anchored guess there
        # outweighs what the shared history holds.
        shared_m = -1
        anchoring = prm.anchor_window > 0 and state.pace >= prm.anchor_pace
        if anchoring and nshared > 0 and _best_match(cands) < prm.anchor_below:
            shared_m = _shared_match(shared, nshared, ctx, ctx_len, prm)
        if anchoring and shared_m < prm.anchor_min:
            _anchor(local, ctx, ctx_len, prm, local_weight, cands)
        if prm.copy_boost > 0:
            _follow_copy(local, ctx, ctx_len, prm, local_weight, state, cands, shared, nshared, shared_m)
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
    return _select(tree, budget, one_branch, prm.confidence, prm.min_score, frontier, out_tokens, out_parents,
                   out_scores)


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
    (tokens, parents, expected, scores) such as ``lookahead.trie.cache.Draft``, built here:
    a namedtuple's Python-level constructor would cost more than the rest of
    a batch's glue."""
    cdef object result_type
    cdef vector[Candidate] cands
    cdef DraftTree tree
    cdef vector[int32_t] frontier
    cdef vector[int32_t] out_tokens
    cdef vector[int32_t] out_parents
    cdef vector[double] out_scores
    cdef vector[int32_t] ctx
    cdef vector[NativeStore*] shared_ptrs
    cdef public int64_t drafts, drafted   # counters for stats()

    def __cinit__(self, type result_type):
        if not issubclass(result_type, tuple):
            raise TypeError(f"result_type must be a tuple subclass, got {result_type!r}")
        self.result_type = result_type

    cdef object _result(self, list tokens, list parents, double expected, list scores):
        # tuple.__new__(result_type, (tokens, parents, expected, scores)), without a Python call
        cdef tuple args = ((tokens, parents, expected, scores),)
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
            return self._result([], [], 0.0, [])
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
                              self.frontier, self.out_tokens, self.out_parents, self.out_scores)
            end_draft()
        if local is not None:
            local.draft_state = state
        self.drafts += 1
        self.drafted += self.out_tokens.size()
        return self._result(list(self.out_tokens), list(self.out_parents), expected, list(self.out_scores))

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
