# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, nonecheck=False
"""Token stores and their n-gram index: the implicit suffix trie, and its writers.

Why not a pointer trie with one node per (position, depth)?  Indexing every
n-gram of depth D costs D nodes per token, so such tries cap their depth
(SGLang's NGRAM trie at 18).  Here the trie is kept *implicit*: a
``TokenStore`` keeps the stream itself (4 bytes per token) and, for a few
n-gram orders, a hash-chain index (LZ77 style) from each n-gram to its most
recent occurrence and from each occurrence to the previous one.  A trie node
"the n-gram ending the context" is the chain of its occurrences; its
children are the tokens that follow them.  So the trie has unbounded depth
(every continuation runs to the end of its stream) for about 30 bytes per
token, and eviction is just overwriting a ring buffer.  Reading it, and the
draft trie built from what is read, are ``_drafting.pyx`` and
``_draft_tree.pyx``.

Three kinds of store share this code: a request's own store (its prompt and
output; grows, is freed when the request ends), a fixed ring, and a scope's
shared history (a ring that ``resize_store`` in ``_native.hpp`` grows and
shrinks within the scopes' shared budget, see ``lookahead.trie.scopes``).

Writers never hold up a draft for long: tokens are appended raw and indexed
afterwards, one bounded chunk (``INDEX_CHUNK`` positions) per lock hold, by
the caller for a few tokens or by the ``Inserter``'s native thread
(``_inserter.pyx``) for prompts and shares; a draft only tries a shared lock
and skips a store being written at that instant.  Everything here that
touches a store runs without the GIL.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.memory cimport make_shared
from libcpp.vector cimport vector

import numpy as np

from lookahead.trie._native cimport MAX_ORDERS, SEPARATOR, NativeStore, hash_step, store_base
from lookahead.trie._tokens cimport _read_tokens


# What only the writers use of _native.hpp: allocation, the map of a small
# history's heads, resizing.  (The insert thread and the count of running
# drafts it yields to are _inserter.pyx's.)
cdef extern from "_native.hpp" namespace "lookahead" nogil:
    void allocate_store(NativeStore* s) except +
    bint reserve_store(NativeStore* s, int64_t cap, int hbits)
    uint32_t map_update(NativeStore* s, int o, uint32_t key, uint32_t head)
    void resize_store(NativeStore* s, int64_t new_cap) except +
    size_t map_bytes "lookahead::map_bytes"(const NativeStore* s)


cdef enum:
    # Positions indexed per lock hold: bounds how long a draft can wait.
    INDEX_CHUNK = 32


cdef inline int _log2_ceil(int64_t x) noexcept nogil:
    cdef int b = 0
    while (<int64_t>1 << b) < x:
        b += 1
    return b


cdef void _store_init(NativeStore* s, int64_t capacity, bint ring, int norders, const int* orders,
                      int key_bits) noexcept nogil:
    # The store's shape; allocate_store then sizes its arrays.  ``key_bits``
    # >= 0: a scope's history, keyed as a full ring of 2**(key_bits + 1)
    # tokens is, which starts empty and is sized by resize_store.
    cdef int o
    s.norders = norders
    for o in range(norders):
        s.orders[o] = orders[o]
    s.ring = ring
    s.scoped = key_bits >= 0
    s.sparse = False
    s.lo = 0
    if s.scoped:
        s.cap = 0
        s.mask = 0
        s.hbits = key_bits
    else:
        s.cap = <int64_t>1 << _log2_ceil(capacity)
        s.mask = <uint64_t>(s.cap - 1)
        # The shared ring uses half as many hash slots as tokens (merged chains are
        # verified token by token anyway); a request's store one slot per token.
        s.hbits = _log2_ceil(s.cap // 2 if ring else s.cap)
    s.n = 0
    s.n_indexed = 0
    s.run = 0


cdef bint _store_grow(NativeStore* s, int64_t need) noexcept nogil:
    """Grow a request store so that ``need`` tokens fit; rehash when the
    index would get crowded.  Positions never wrap in a growing store, so
    slots keep their meaning across a resize.  False: out of memory, and
    the store is unchanged."""
    cdef int64_t new_cap = s.cap
    cdef int o
    cdef bint rehash
    while new_cap < need:
        new_cap *= 2
    if new_cap == s.cap:
        return True
    rehash = new_cap > (<int64_t>2 << s.hbits)
    if not reserve_store(s, new_cap, _log2_ceil(new_cap) if rehash else s.hbits):
        return False
    s.tok.resize(new_cap, SEPARATOR)
    s.cap = new_cap
    s.mask = <uint64_t>(new_cap - 1)
    if rehash:
        # Every position is indexed again, from empty chains.
        s.hbits = _log2_ceil(s.cap)
        for o in range(s.norders):
            s.head[o].assign(<size_t>1 << s.hbits, 0)
            s.prev[o].assign(s.cap, 0)
        s.n_indexed = 0
        s.run = 0
    else:
        for o in range(s.norders):
            s.prev[o].resize(new_cap, 0)
    return True


cdef bint _append_locked(NativeStore* s, const int32_t* src, int64_t count) noexcept nogil:
    # False: a request store could not grow (out of memory); nothing appended.
    cdef int64_t i, start
    if not s.ring:
        if not _store_grow(s, s.n + count):
            return False
    elif count > s.cap:
        # Only the newest ``cap`` tokens can survive.
        src += count - s.cap
        s.n += count - s.cap
        if s.n_indexed < s.n:
            s.n_indexed = s.n
            s.run = 0
        count = s.cap
    if s.ring and s.n + count - s.cap > s.n_indexed:
        # Tokens about to be overwritten were never indexed: skip them.
        s.n_indexed = s.n + count - s.cap
        s.run = 0
    start = s.n
    for i in range(count):
        s.tok[(start + i) & s.mask] = src[i]
    s.n += count
    return True


cdef int64_t _index_locked(NativeStore* s, int64_t limit) noexcept nogil:
    """Link up to ``limit`` appended positions into the chains; returns
    how many positions (separators included) it advanced."""
    cdef int64_t p, stop = s.n
    cdef int o, k, j, prev_k, shift = 64 - s.hbits
    cdef int32_t t
    cdef uint64_t h, slot
    cdef uint32_t e, d
    cdef int64_t done = 0
    if stop - s.n_indexed > limit:
        stop = s.n_indexed + limit
    p = s.n_indexed
    while p < stop:
        t = s.tok[p & s.mask]
        if t < 0:
            s.run = 0
            p += 1
            done += 1
            continue
        s.run += 1
        h = 0
        prev_k = 0
        for o in range(s.norders):
            k = s.orders[o]
            if s.run < k:
                break
            for j in range(prev_k, k):
                h = hash_step(h, s.tok[(p - j) & s.mask])
            prev_k = k
            slot = h >> shift
            if s.sparse:
                e = map_update(s, o, <uint32_t>slot, <uint32_t>(p + 1))
            else:
                e = s.head[o][slot]
                s.head[o][slot] = <uint32_t>(p + 1)
            d = 0
            if e != 0:
                d = <uint32_t>(<uint32_t>(p + 1) - e)
                if d >= <uint64_t>s.cap:
                    d = 0
            s.prev[o][p & s.mask] = d
        p += 1
        done += 1
    s.n_indexed = p
    return done


cdef bint _store_append(NativeStore* s, const int32_t* src, int64_t count, bint index_now) noexcept nogil:
    """Append tokens; index them too if ``index_now`` and nothing is pending.
    False: out of memory, nothing appended."""
    cdef bint caught_up, appended
    s.mtx.lock()
    caught_up = s.n_indexed == s.n
    appended = _append_locked(s, src, count)
    if appended and index_now and caught_up:
        # Usually just the new tokens; everything after a rehash.
        _index_locked(s, s.n - s.n_indexed)
    s.mtx.unlock()
    return appended


cdef void _store_append_chunked(NativeStore* s, const int32_t* src, int64_t count) noexcept nogil:
    """Append and index a long run, releasing the lock between chunks (the
    shared ring's: a ring never grows, so appending cannot fail)."""
    cdef int64_t off = 0, step
    while off < count:
        step = count - off
        if step > INDEX_CHUNK:
            step = INDEX_CHUNK
        s.mtx.lock()
        _append_locked(s, src + off, step)
        _index_locked(s, s.n - s.n_indexed)
        s.mtx.unlock()
        off += step


cdef int64_t _index_chunk(NativeStore* s) noexcept nogil:
    # Index the next INDEX_CHUNK appended positions under the lock; returns
    # how many positions it advanced (0: everything is indexed).
    cdef int64_t done
    s.mtx.lock()
    done = _index_locked(s, INDEX_CHUNK)
    s.mtx.unlock()
    return done


cdef void _store_catch_up(NativeStore* s) noexcept nogil:
    """Index everything appended so far (a prompt), one chunk per lock hold,
    on the caller's thread (the insert thread's own catch-up also waits for
    running drafts before each chunk: see _catch_up in _inserter.pyx)."""
    while _index_chunk(s) > 0:
        pass


cdef bint _whole_hash(NativeStore* s, int64_t p, int k, uint64_t* h) noexcept nogil:
    # The hash of the k-gram ending at p, as _index_locked keys it; False if
    # it holds a separator (then no chain holds p at that order).
    cdef int j
    cdef int32_t t
    h[0] = 0
    for j in range(k):
        t = s.tok[(p - j) & s.mask]
        if t < 0:
            return False
        h[0] = hash_step(h[0], t)
    return True


cdef int _freeze_order(NativeStore* s, int o) except -1 nogil:
    """Lay out order ``o``'s chains one after another (``frozen`` in
    _native.hpp), then free its links and heads.  Caller holds ``s.mtx``
    exclusively, on a store fit for it (see TokenStore.freeze).  A chain
    holds the positions whose n-gram hashes to its key, newest first, as
    _index_locked links them: counted, then placed (a counting sort)."""
    cdef int64_t p, n = s.n
    cdef int k = s.orders[o], shift = 64 - s.hbits
    cdef size_t slots = <size_t>1 << s.hbits, i
    cdef uint64_t h
    cdef uint32_t slot
    s.cstart[o].assign(slots + 1, 0)   # a bad_alloc leaves the order linked (see freeze)
    for p in range(k - 1, n):
        if _whole_hash(s, p, k, &h):
            s.cstart[o][(h >> shift) + 1] += 1
    for i in range(slots):
        s.cstart[o][i + 1] += s.cstart[o][i]
    s.occ[o].resize(s.cstart[o][slots])
    # Newest first: positions descending, each placed at its chain's cursor,
    # which ends at the chain's end, the next chain's start: shifted back.
    for p in range(n - 1, k - 2, -1):
        if _whole_hash(s, p, k, &h):
            slot = <uint32_t>(h >> shift)
            s.occ[o][s.cstart[o][slot]] = <uint32_t>p
            s.cstart[o][slot] += 1
    for i in range(slots, 0, -1):
        s.cstart[o][i] = s.cstart[o][i - 1]
    s.cstart[o][0] = 0
    s.frozen |= <uint32_t>1 << o
    s.head[o].clear()
    s.head[o].shrink_to_fit()
    s.prev[o].clear()
    s.prev[o].shrink_to_fit()
    return 0


cdef int _check_resize(TokenStore store, int64_t capacity) except -1:
    if not store.s.scoped:
        raise ValueError("only a scope's history (key_bits >= 0) is resized")
    if capacity < 16 or capacity & (capacity - 1) or capacity > (<int64_t>2 << store.s.hbits):
        raise ValueError(f"capacity must be a power of two in [16, {2 << store.s.hbits}], got {capacity}")
    return 0


cdef class TokenStore:
    """One token stream with its n-gram occurrence index.

    ``ring=True``: a fixed-capacity ring that evicts its oldest tokens.
    With ``key_bits`` >= 0 it is a scope's shared history: empty until
    :meth:`resize` (or an :class:`Inserter` resize job) gives it room, and
    chained as a full ring of ``2 ** (key_bits + 1)`` tokens is at any size
    (see resize_store in ``_native.hpp``).  ``ring=False``: grows with the
    stream and is freed as a whole (one request's prompt and output).
    Tokens are appended raw and
    indexed afterwards, possibly by the inserter thread, so ``appended``
    (tokens stored, readable as continuations) can run ahead of ``indexed``
    (positions that can be found by a match).  The data lives in a native
    ``NativeStore`` that queued inserts co-own, so dropping the Python object
    never frees memory an insert is writing.
    """

    # ptr, s and draft_state are declared in _store.pxd.

    def __cinit__(self, int64_t capacity, bint ring, orders, int key_bits=-1):
        cdef int i
        cdef int c_orders[MAX_ORDERS]
        if key_bits >= 0 and (not ring or key_bits < 4 or key_bits > 32):
            raise ValueError(f"a scope's history is a ring keyed by 4 to 32 bits, got key_bits={key_bits}")
        if capacity < 16:
            capacity = 16
        if len(orders) < 1 or len(orders) > MAX_ORDERS:
            raise ValueError(f"between 1 and {MAX_ORDERS} n-gram orders are supported, got {len(orders)}")
        for i in range(len(orders)):
            c_orders[i] = int(orders[i])
            if c_orders[i] < 1 or (i > 0 and c_orders[i] <= c_orders[i - 1]):
                raise ValueError(f"n-gram orders must be positive and increasing, got {list(orders)}")
        self.ptr = make_shared[NativeStore]()
        self.s = self.ptr.get()
        _fresh_state(&self.draft_state)
        _store_init(self.s, capacity, ring, len(orders), c_orders, key_bits)
        if self.s.scoped:
            self.s.prev.resize(len(orders))
            self.s.head.resize(len(orders))
            self.s.smap.resize(len(orders))
            return
        try:
            allocate_store(self.s)
        except MemoryError:
            nbytes = self.s.cap * 4 * (1 + len(orders)) + len(orders) * 4 * (1 << self.s.hbits)
            raise MemoryError(f"out of memory for a token store of {self.s.cap:,} tokens "
                              f"({nbytes:,} bytes with its index)") from None

    # -- Python-facing helpers (validation happens in lookahead.trie.cache) -------

    def append_tokens(self, const int32_t[::1] tokens, bint index_now=True):
        """Append ``tokens`` (int32, already validated).  With ``index_now``
        they are indexed at once, which is cheap for a few tokens; otherwise
        call :meth:`index_pending` (or queue it on an :class:`Inserter`)."""
        cdef int64_t count = tokens.shape[0]
        cdef bint appended
        self._check_writable()
        if count == 0:
            return
        with nogil:
            appended = _store_append(self.s, &tokens[0], count, index_now)
        if not appended:
            self._out_of_memory(count)

    def append_checked(self, object tokens, int64_t max_id, str what="tokens"):
        """Validate ``tokens`` and append them, indexed at once.  Returns how
        many were appended.  Nothing is appended if any id is bad, or if the
        store cannot grow to hold them (``MemoryError``)."""
        cdef vector[int32_t] buf
        cdef bint appended = True
        self._check_writable()
        _read_tokens(tokens, -1, max_id, buf, what)
        if buf.size():
            with nogil:
                appended = _store_append(self.s, buf.data(), buf.size(), True)
        if not appended:
            self._out_of_memory(buf.size())
        return buf.size()

    cdef int _out_of_memory(self, int64_t count) except -1:
        raise MemoryError(f"out of memory growing a token store of {self._counts().n:,} tokens "
                          f"by {count:,}; nothing was appended")

    def append_indexed(self, const int32_t[::1] tokens):
        """Append and index a long run in lock-bounded chunks (no GIL)."""
        cdef int64_t count = tokens.shape[0]
        self._check_writable()
        if count == 0:
            return
        with nogil:
            _store_append_chunked(self.s, &tokens[0], count)

    def mark_prompt_end(self):
        """What is appended from now on is the request's output (which drafts
        may weigh above its prompt, see ``output_weight``)."""
        self.draft_state.prompt_end = self._counts().n

    def index_pending(self):
        """Index all appended tokens (no GIL, one chunk per lock hold)."""
        self._check_writable()
        with nogil:
            _store_catch_up(self.s)

    cdef void _copy(self, int64_t start, int64_t end, vector[int32_t]& out) noexcept nogil:
        # Tokens at absolute positions [start, end), clipped to what is held.
        cdef NativeStore* s = self.s
        cdef int64_t i
        s.mtx.lock_shared()   # a reader: drafts of this request go on meanwhile
        if start < store_base(s):
            start = store_base(s)
        if start < 0:
            start = 0
        if end > s.n:
            end = s.n
        for i in range(start, end):
            out.push_back(s.tok[i & s.mask])
        s.mtx.unlock_shared()

    def slice(self, int64_t start, int64_t end):
        """Tokens at absolute positions [start, end), clipped to what is held
        (a copy; separators are -1)."""
        cdef vector[int32_t] buf
        cdef size_t i
        with nogil:
            self._copy(start, end, buf)
        out = np.empty(buf.size(), dtype=np.int32)
        cdef int32_t[::1] view = out
        for i in range(buf.size()):
            view[i] = buf[i]
        return out

    def tokens(self):
        """All live tokens, oldest first (a copy)."""
        return self.slice(0, self.appended)

    # The counters below are written by the inserter thread (and by whichever
    # thread appends), so they are read under the store's shared lock: at
    # most one index chunk's wait, and never a torn or stale-by-a-grow value.
    cdef StoreCounts _counts(self) noexcept nogil:
        cdef NativeStore* s = self.s
        cdef StoreCounts c
        cdef int o
        s.mtx.lock_shared()
        c.n = s.n
        c.n_indexed = s.n_indexed
        c.cap = s.cap
        c.lo = store_base(s)
        c.index_bytes = map_bytes(s)
        for o in range(s.norders):
            c.index_bytes += s.prev[o].size() * 4 + s.head[o].size() * 4
            if s.frozen >> o & 1:
                c.index_bytes += s.cstart[o].size() * 4 + s.occ[o].size() * 4
        s.mtx.unlock_shared()
        return c

    @property
    def size(self):
        """Tokens currently held (after eviction)."""
        cdef StoreCounts c = self._counts()
        return c.n - c.lo

    @property
    def appended(self):
        return self._counts().n

    @property
    def indexed(self):
        return self._counts().n_indexed

    @property
    def capacity(self):
        return self._counts().cap

    @property
    def nbytes(self):
        """Bytes held by the stream and its index."""
        cdef StoreCounts c = self._counts()
        return c.cap * 4 + c.index_bytes

    cdef int _check_writable(self) except -1:
        if self.s.frozen:
            raise ValueError("this token store is frozen (see freeze): it is not written to any more")
        return 0

    def freeze(self):
        """Lay out the chains of a store that will not change any more (a
        corpus piece, once loaded) one after another instead of linked, for
        faster drafts (``frozen`` in _native.hpp); drafts read the same
        occurrences in the same order.  One order at a time, each under the
        store's lock (drafts skip the store meanwhile), its links freed as
        soon as it is laid out, so memory grows by at most one order's index
        meanwhile.  Afterwards nothing may be appended.  Returns whether it
        was frozen: only a ring that is fully indexed and has never wrapped
        is (a corpus piece); anything else is left as it is."""
        cdef NativeStore* s = self.s
        cdef int o
        cdef bint fit
        s.mtx.lock_shared()
        fit = (s.ring and not s.scoped and not s.sparse and s.n <= s.cap and s.lo == 0
               and s.n_indexed == s.n and s.n < (<int64_t>1 << 32))
        s.mtx.unlock_shared()
        if not fit:
            return False
        if not s.frozen:
            s.cstart.resize(s.norders)
            s.occ.resize(s.norders)
        for o in range(s.norders):
            if s.frozen >> o & 1:
                continue
            try:
                with nogil:
                    s.mtx.lock()
                    try:
                        _freeze_order(s, o)
                    finally:
                        s.mtx.unlock()
            except MemoryError:
                # This order stays linked (and readable); what it got is freed.
                s.cstart[o].clear()
                s.cstart[o].shrink_to_fit()
                s.occ[o].clear()
                s.occ[o].shrink_to_fit()
                raise
        return True

    @property
    def frozen(self):
        """Whether :meth:`freeze` laid out this store's chains."""
        return self.s.frozen != 0

    @property
    def sparse(self):
        """Whether a scope's history keeps its chain heads in a map (while it
        is small) rather than the full-size table."""
        return self.s.sparse

    def resize(self, int64_t capacity):
        """Give a scope's history room for ``capacity`` tokens (a power of
        two), keeping its newest ones; see resize_store in ``_native.hpp``.
        Only while nothing else writes the store (it is being loaded): a
        server's histories are resized by :meth:`Inserter.resize`."""
        _check_resize(self, capacity)
        try:
            resize_store(self.s, capacity)
        except MemoryError:
            raise MemoryError(f"out of memory resizing a scope's history to {capacity:,} tokens; "
                              f"it is unchanged") from None
