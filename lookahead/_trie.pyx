# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, nonecheck=False
"""The native drafting core: an implicit suffix trie over token streams.

Why not a pointer trie with one node per (position, depth)?  Indexing every
n-gram of depth D costs D nodes per token (SGLang's NGRAM trie pays about
3 kB per token and caps depth at 18).  Here the trie is kept *implicit*:

* a ``TokenStore`` keeps the stream itself (4 bytes per token) and, for a few
  n-gram orders, a hash-chain index (LZ77 style) from each n-gram to its most
  recent occurrence and from each occurrence to the previous one.  A trie node
  "the n-gram ending the context" is the chain of its occurrences; its
  children are the tokens that follow those occurrences.  So the trie has
  unbounded depth (every continuation runs to the end of its stream) for
  about 30 bytes per token, and eviction is just overwriting a ring buffer.
* at draft time the occurrences of the context's longest matching suffixes are
  gathered from the request's own store and from the shared history, each
  weighted by how long it matches, and their continuations are merged into a
  small *explicit* draft trie whose node weights are occurrence frequencies
  (expanded only as far as the selection reaches).
  The best ``budget`` nodes (multi-branch) or the heaviest chain (one-branch)
  are the draft.

Every hot path (indexing, matching, draft extraction) runs without the GIL.
Writers hold a store's lock for one bounded chunk at a time; a draft only
tries a shared lock and skips a store being written at that instant, so it
never waits for an insert.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.math cimport pow
from libcpp.memory cimport make_shared, shared_ptr
from libcpp.vector cimport vector

from cpython.object cimport PyObject, PyTypeObject

import numpy as np
cimport numpy as cnp

cnp.import_array()


cdef extern from "<mutex>" namespace "std" nogil:
    cppclass mutex:
        mutex()
        void lock()
        void unlock()


cdef extern from "<shared_mutex>" namespace "std" nogil:
    cppclass shared_mutex:
        shared_mutex()
        void lock()
        void unlock()
        void lock_shared()
        bint try_lock_shared()
        void unlock_shared()


cdef extern from "_native.hpp" namespace "lookahead" nogil:
    cppclass NativeStore:
        vector[int32_t] tok
        vector[vector[uint32_t]] prev
        vector[vector[uint32_t]] head
        vector[vector[uint64_t]] smap
        int64_t n
        int64_t n_indexed
        int64_t run
        int64_t cap
        int64_t lo
        uint64_t mask
        int hbits
        bint ring
        bint scoped
        bint sparse
        int norders
        int orders[8]
        shared_mutex mtx
    ctypedef shared_ptr[NativeStore] StorePtr
    void allocate_store(NativeStore* s) except +
    bint reserve_store(NativeStore* s, int64_t cap, int hbits)
    int64_t store_base(const NativeStore* s)
    uint32_t chain_head(const NativeStore* s, int o, uint32_t key)
    const void* chain_head_address(const NativeStore* s, int o, uint32_t key)
    uint32_t map_update(NativeStore* s, int o, uint32_t key, uint32_t head)
    void resize_store(NativeStore* s, int64_t new_cap) except +
    size_t map_bytes "lookahead::map_bytes"(const NativeStore* s)
    cdef enum JobKind:
        kAppend
        kIndexPending
        kResize
    void draft_begin()
    void draft_end()
    int drafts_in_progress()
    void yield_to_drafts()
    ctypedef void (*ApplyFn)(NativeStore*, const int32_t*, int64_t, bint) noexcept nogil
    cppclass InsertThread:
        InsertThread(ApplyFn apply, size_t max_pending)
        void submit(const StorePtr& store, const int32_t* tokens, int64_t count, int kind,
                    bint urgent) except +
        void synchronize()
        size_t pending()
        uint64_t failures()
        void close()


cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil

cdef enum:
    MAX_ORDERS = 8
    SEPARATOR = -1
    # Positions indexed per lock hold: bounds how long a draft can wait.
    INDEX_CHUNK = 32
    # Most candidate occurrences gathered for one draft (scratch sizing).
    MAX_CANDIDATES_LIMIT = 256

cdef uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL
cdef double INITIAL_PACE = 2.0   # a new request's pace (see _draft)
cdef double PACE_DECAY = 0.8     # ... and how much of it each draft keeps


cdef inline int _log2_ceil(int64_t x) noexcept nogil:
    cdef int b = 0
    while (<int64_t>1 << b) < x:
        b += 1
    return b


cdef object _as_token_array = None

cdef extern from "Python.h":
    PyTypeObject PyTuple_Type
    PyTypeObject PyLong_Type
    PyTypeObject* Py_TYPE(PyObject* o)
    PyObject* _list_item "PyList_GET_ITEM" (PyObject* seq, Py_ssize_t i)
    PyObject* _tuple_item "PyTuple_GET_ITEM" (PyObject* seq, Py_ssize_t i)
    long long PyLong_AsLongLongAndOverflow(PyObject* o, int* overflow)


cdef int _bad_token(str what, object value, Py_ssize_t index, int64_t max_id) except -1:
    raise ValueError(f"{what}: token id {value} at index {index} is outside [0, {max_id}]")


cdef int _read_tokens(object src, Py_ssize_t tail, int64_t max_id, vector[int32_t]& out,
                      str what) except -1:
    """Copy the last ``tail`` ids of ``src`` (all if ``tail < 0``) into ``out``,
    checking each.  Lists, tuples and int32/int64 arrays take a fast path (only
    the tail is read: no per-step copy of a whole context); anything else goes
    through ``lookahead.tokens.as_token_array`` for its checks and messages."""
    global _as_token_array
    cdef Py_ssize_t n, start, i
    cdef object item
    cdef int64_t v
    cdef const int32_t[:] v32
    cdef cnp.ndarray arr
    cdef const char* data
    cdef Py_ssize_t stride
    cdef int typenum, overflow
    cdef PyObject* seq
    cdef PyObject* it
    cdef bint is_list
    out.clear()
    if type(src) is list or type(src) is tuple:
        n = len(src)
        start = 0 if tail < 0 or tail >= n else n - tail
        out.reserve(n - start)
        is_list = type(src) is list
        seq = <PyObject*>src
        for i in range(start, n):
            # An exact int in range is read in C (a worker's contexts are
            # lists: the Python comparisons cost 18 ns a token).  The GIL is
            # held and nothing here runs Python code, so the sequence cannot
            # change under the borrowed reference.
            it = _list_item(seq, i) if is_list else _tuple_item(seq, i)
            if Py_TYPE(it) == &PyLong_Type:
                v = PyLong_AsLongLongAndOverflow(it, &overflow)
                if overflow == 0 and v >= 0 and v <= max_id:
                    out.push_back(<int32_t>v)
                    continue
            item = src[i]
            if type(item) is not int:
                if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
                    raise TypeError(f"{what}: token ids must be integers, got {type(item).__name__} at index {i}")
            if item < 0 or item > max_id:  # compared as Python ints: no overflow
                _bad_token(what, item, i, max_id)
            v = item
            out.push_back(<int32_t>v)
        return 0
    if cnp.PyArray_Check(src):
        # Read through the C API: acquiring a typed memoryview, or comparing
        # dtypes in Python, costs more than reading a step's few ids.
        arr = <cnp.ndarray>src
        typenum = cnp.PyArray_TYPE(arr)
        if (cnp.PyArray_NDIM(arr) == 1 and (typenum == cnp.NPY_INT32 or typenum == cnp.NPY_INT64)
                and cnp.PyArray_ISNOTSWAPPED(arr)):
            n = cnp.PyArray_DIM(arr, 0)
            start = 0 if tail < 0 or tail >= n else n - tail
            data = <const char*>cnp.PyArray_DATA(arr)
            stride = cnp.PyArray_STRIDE(arr, 0)
            for i in range(start, n):
                if typenum == cnp.NPY_INT32:
                    v = (<const int32_t*>(data + i * stride))[0]
                else:
                    v = (<const int64_t*>(data + i * stride))[0]
                if v < 0 or v > max_id:
                    _bad_token(what, v, i, max_id)
                out.push_back(<int32_t>v)
            return 0
    if _as_token_array is None:
        from lookahead.tokens import as_token_array
        _as_token_array = as_token_array
    if tail >= 0:
        try:
            src = src[-tail:] if tail > 0 else src[:0]
        except TypeError:
            raise TypeError(f"{what}: expected a sequence of token ids, got {type(src).__name__}") from None
    arr = _as_token_array(src, what, None if max_id >= 0x7FFFFFFF else max_id + 1)
    v32 = arr
    for i in range(v32.shape[0]):
        out.push_back(v32[i])
    return 0


def drafts_running():
    """Drafts in progress in this process (the insert thread yields to them)."""
    return drafts_in_progress()


def read_tokens(object src, int64_t max_id, str what="tokens"):
    """``src`` as a new int32 array after the same per-item checks as every
    other input (lists are checked item by item: ``True`` is not a token)."""
    cdef vector[int32_t] buf
    _read_tokens(src, -1, max_id, buf, what)
    out = np.empty(buf.size(), dtype=np.int32)
    cdef int32_t[::1] view = out
    cdef size_t i
    for i in range(buf.size()):
        view[i] = buf[i]
    return out


# ---------------------------------------------------------------------------
# Token stores: the stream, its index, and their writers
# ---------------------------------------------------------------------------

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
                h = (h ^ <uint32_t>s.tok[(p - j) & s.mask]) * GOLDEN
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


cdef void _store_catch_up(NativeStore* s) noexcept nogil:
    """Index everything appended so far (a prompt), one chunk per lock hold,
    each after any running draft (see yield_to_drafts in _native.hpp)."""
    cdef int64_t done = 1
    while done > 0:
        yield_to_drafts()
        s.mtx.lock()
        done = _index_locked(s, INDEX_CHUNK)
        s.mtx.unlock()


cdef void _apply_insert(NativeStore* s, const int32_t* tokens, int64_t count, bint index_pending) noexcept nogil:
    # The inserter thread's job body (see InsertThread in _native.hpp).
    if index_pending:
        _store_catch_up(s)
    elif count > 0:
        _store_append_chunked(s, tokens, count)


cdef struct DraftState:
    # What a request's drafts carry from one step to the next.
    int64_t n      # the request's stream length at its last draft (-1: none yet)
    int64_t used   # the copy cursor (see _follow_copy): the source position that draft looked at (-1: none)
    int64_t src    # ... where that draft's heaviest own-stream occurrence ended (-1: none)
    double pace    # moving average of the tokens the stream grew by between drafts (see _draft)
    int64_t prompt_end  # where the request's output starts in the stream (-1: not marked, see mark_prompt_end)


cdef inline void _fresh_state(DraftState* st) noexcept nogil:
    st.n = st.used = st.src = st.prompt_end = -1
    st.pace = INITIAL_PACE


cdef struct StoreCounts:
    int64_t n
    int64_t lo
    int64_t n_indexed
    int64_t cap
    int64_t index_bytes


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

    cdef StorePtr ptr
    cdef NativeStore* s
    cdef DraftState draft_state   # read and written by drafts, with the GIL held

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

    # -- Python-facing helpers (validation happens in lookahead.cache) -------

    def append_tokens(self, const int32_t[::1] tokens, bint index_now=True):
        """Append ``tokens`` (int32, already validated).  With ``index_now``
        they are indexed at once, which is cheap for a few tokens; otherwise
        call :meth:`index_pending` (or queue it on an :class:`Inserter`)."""
        cdef int64_t count = tokens.shape[0]
        cdef bint appended
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


cdef class Inserter:
    """The background writer of :class:`TokenStore` s: one native thread that
    applies inserts in submission order and never takes the GIL (see
    ``_native.hpp`` for why).  ``background=False`` applies each insert on
    the caller's thread instead (debugging, and processes that must not
    start threads)."""

    cdef InsertThread* thread
    cdef bint background

    def __cinit__(self, bint background=True, size_t max_pending=256):
        self.background = background
        self.thread = new InsertThread(_apply_insert, max_pending if max_pending > 1 else 2)

    def __dealloc__(self):
        if self.thread != NULL:
            with nogil:
                self.thread.close()
            del self.thread
            self.thread = NULL

    cdef int _submit(self, TokenStore store, const int32_t* tokens, int64_t count, int kind,
                     bint urgent) except -1:
        if not self.background:
            if kind == kResize:
                resize_store(store.s, count)   # MemoryError here, on the caller's thread
            else:
                with nogil:
                    _apply_insert(store.s, tokens, count, kind == kIndexPending)
            return 0
        with nogil:
            self.thread.submit(store.ptr, tokens, count, kind, urgent)
        return 0

    def index_pending(self, TokenStore store):
        """Index whatever ``store`` holds unindexed (a prompt appended raw)."""
        self._submit(store, NULL, 0, kIndexPending, True)

    def share(self, TokenStore shared, TokenStore source, int64_t start, int64_t end, int64_t context):
        """Append ``source``'s tokens [start, end) to ``shared`` behind a
        separator, with ``context`` tokens before ``start`` so the first new
        ones have n-grams to be found by (copied here, natively: no Python
        list or array per flush).  Returns how many tokens that appends."""
        cdef vector[int32_t] buf
        buf.push_back(SEPARATOR)
        with nogil:
            source._copy(start - context, end, buf)  # _copy clips to what is held
        # Not urgent: no draft waits for it, so no wake-up on the decode path.
        self._submit(shared, buf.data(), buf.size(), kAppend, False)
        return buf.size()

    def resize(self, TokenStore store, int64_t capacity):
        """Queue :meth:`TokenStore.resize` of a scope's history: applied in
        order with the shares (so the same calls size every history the
        same way), off the caller's thread.  A resize the process cannot
        allocate leaves the history as it was and counts in ``failures``."""
        _check_resize(store, capacity)
        self._submit(store, NULL, capacity, kResize, False)

    def synchronize(self):
        """Wait (GIL released) until every insert submitted so far is applied."""
        with nogil:
            self.thread.synchronize()

    def pending(self):
        return self.thread.pending()

    @property
    def failures(self):
        return self.thread.failures()

    def close(self):
        """Apply what is queued and stop the thread (a later insert restarts it)."""
        with nogil:
            self.thread.close()

# ---------------------------------------------------------------------------
# Drafting
# ---------------------------------------------------------------------------

cdef struct DraftParams:
    int max_match          # longest suffix verified against an occurrence
    int max_walk           # chain steps per order and store
    int max_candidates     # occurrences merged into one draft
    int enough_candidates  # stop descending orders once this many are found
    double match_exponent  # weight of an occurrence = match_len ** match_exponent
    double local_weight    # the request's own stream counts this much more (trees)
    double chain_local_weight  # ... in one-branch drafts
    int min_match          # occurrences shorter than this are ignored
    double confidence      # pseudo-weight of unseen continuations (see _score_children)
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


cdef struct Candidate:
    int64_t pos
    int match
    double weight


cdef struct TrieNode:
    int32_t token
    int32_t parent
    int32_t first_child
    int32_t next_sibling
    int32_t depth
    int32_t first      # the first continuation through it: with depth, the order nodes are met in
    int32_t head, tail # the continuations through it, until it is expanded (then -1, see _expand)
    int32_t slot       # its index in the draft, once selected
    double weight      # their summed weights
    double score       # estimated probability that the target accepts the path


cdef struct Continuation:
    double weight
    int32_t start      # its tokens: DraftTree.toks[start: start + length]
    int32_t length
    int32_t next       # the next continuation through the same unexpanded node, or -1


cdef struct DraftTree:
    # The draft trie, built lazily: occurrences' continuations are copied out
    # of their stores (``conts``, ``toks``) while the store is locked, and a
    # node's children are only made when the selection reaches the node.
    vector[TrieNode] nodes
    vector[Continuation] conts
    vector[int32_t] toks
    vector[int32_t] child_tok, child_id   # scratch of _expand


cdef class DraftConfig:
    """Tunable knobs of :func:`draft_one` (validated in lookahead.cache)."""
    cdef DraftParams p

    def __cinit__(self, int max_match=32, int max_walk=16, int max_candidates=32,
                  int enough_candidates=12, double match_exponent=2.0,
                  double local_weight=4.0, double chain_local_weight=4.0, int min_match=1, double confidence=0.0,
                  double order_norm=0.0, int top_walk=0, int low_walk=0, int anchor_window=0,
                  int anchor_below=4, int anchor_gap=24, int anchor_min=16, double copy_boost=0.0,
                  int wildcard_tokens=0, double mismatch_weight=0.0, double wildcard_weight=0.0,
                  double wildcard_pace=0.0, int wildcard_walk=4, double output_weight=1.0,
                  double wildcard_below=float("inf")):
        self.p.max_match = max_match
        self.p.max_walk = max_walk
        self.p.max_candidates = min(max_candidates, MAX_CANDIDATES_LIMIT)
        self.p.enough_candidates = enough_candidates
        self.p.match_exponent = match_exponent
        self.p.local_weight = local_weight
        self.p.chain_local_weight = chain_local_weight
        self.p.min_match = min_match
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


cdef inline double _powi(double base, double e) noexcept nogil:
    # match_len ** exponent; the common integer exponents skip libm.
    if e == 2.0:
        return base * base
    if e == 1.0:
        return base
    return pow(base, e)


cdef inline void _suffix_hashes(NativeStore* s, const int32_t* ctx, int ctx_len, uint64_t* hashes) noexcept nogil:
    # Each order's suffix of the context, hashed as _index_locked hashes
    # n-grams (0 for an order longer than the context).
    cdef uint64_t h = 0
    cdef int o, j, k, prev_k = 0
    for o in range(s.norders):
        k = s.orders[o]
        if k > ctx_len:
            hashes[o] = 0
            continue
        for j in range(prev_k, k):
            h = (h ^ <uint32_t>ctx[ctx_len - 1 - j]) * GOLDEN
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
                 double store_weight, bint one_branch, vector[Candidate]& cands) noexcept nogil:
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

    if s.n_indexed == 0 or ctx_len == 0:
        return 0
    _suffix_hashes(s, ctx, ctx_len, hashes)
    o = s.norders - 1
    while o >= 0:
        k = s.orders[o]
        q = _chain_start(s, o, hashes, ctx_len, prm)
        if q < 0:
            o -= 1
            continue
        order_start = cands.size()
        walk = _walk_limit(s, o, prm, one_branch)
        # Scouts walk the chains of the lower orders, which are walked next
        # if this one finds too few, a step per step of this walk: each
        # step is a cache miss in a large store, and independent chains
        # wait for memory at the same time.  They only read, so what is
        # gathered does not change.
        nscouts = 0
        for so in range(o - 1, -1, -1):
            sq = _chain_start(s, so, hashes, ctx_len, prm)
            if sq >= 0:
                scout_order[nscouts] = so
                scout_q[nscouts] = sq
                scout_walk[nscouts] = _walk_limit(s, so, prm, one_branch)
                nscouts += 1
        steps = 0
        while q >= base and q < s.n_indexed and steps < walk:
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
            d = s.prev[o][q & s.mask]
            if d == 0:
                break
            q -= d
        if prm.order_norm > 0 and <int>cands.size() > order_start:
            scale = pow(<double>(<int>cands.size() - order_start), -prm.order_norm)
            for c in range(order_start, cands.size()):
                cands[c].weight *= scale
        if found >= prm.enough_candidates or <int>cands.size() >= prm.max_candidates:
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


cdef inline TrieNode _leaf(int32_t token, int32_t parent, int32_t depth, int32_t first) noexcept nogil:
    # A node with no children, no continuations and no weight yet.
    cdef TrieNode node
    node.token = token
    node.parent = parent
    node.first_child = -1
    node.next_sibling = -1
    node.depth = depth
    node.first = first
    node.head = node.tail = -1
    node.slot = -1
    node.weight = 0.0
    node.score = 0.0
    return node


cdef int32_t _new_child(vector[TrieNode]& nodes, int32_t parent, int32_t token, int32_t first) noexcept nogil:
    cdef int32_t c
    cdef TrieNode node = _leaf(token, parent, nodes[parent].depth + 1, first)
    node.next_sibling = nodes[parent].first_child
    nodes.push_back(node)
    c = <int32_t>nodes.size() - 1
    nodes[parent].first_child = c
    return c


cdef inline void _add_member(DraftTree& tree, int32_t node, int32_t m) noexcept nogil:
    # Thread continuation m onto node's list, in the order they were merged.
    cdef TrieNode* x = &tree.nodes[node]
    tree.conts[m].next = -1
    if x.tail >= 0:
        tree.conts[x.tail].next = m
    else:
        x.head = m
    x.tail = m
    x.weight += tree.conts[m].weight


cdef void _merge(NativeStore* s, const Candidate* cand, int depth, DraftTree& tree) noexcept nogil:
    """Add one occurrence's continuation (up to ``depth`` tokens) to the draft
    trie: copied out of the store, which must be locked (``s.mtx``), to be
    expanded by _expand as far as the selection needs."""
    cdef int64_t q = cand.pos + 1
    cdef int32_t t
    cdef int i
    cdef Continuation cont
    cont.start = <int32_t>tree.toks.size()
    cont.weight = cand.weight
    for i in range(depth):
        if q >= s.n:
            break
        t = s.tok[q & s.mask]
        if t < 0:
            break
        tree.toks.push_back(t)
        q += 1
    cont.length = <int32_t>tree.toks.size() - cont.start
    if cont.length == 0:
        return
    tree.conts.push_back(cont)
    _add_member(tree, 0, <int32_t>tree.conts.size() - 1)


cdef void _expand(DraftTree& tree, int32_t x) noexcept nogil:
    """Make node x's children from the continuations through it.

    Merging every continuation to its full depth up front made about 200
    nodes per draft (budget 8, the bench's batch-4 step), most of them deep in
    branches the selection never reaches.  Weights are summed in merge order
    and ties broken by merge order (_earlier), as the eager merge did, so the
    drafts are the same."""
    cdef int32_t m, nxt, c, d, t
    cdef size_t i, n
    d = tree.nodes[x].depth
    m = tree.nodes[x].head
    # Its continuations move on to the children: x has none left, so
    # expanding it again changes nothing.
    tree.nodes[x].head = tree.nodes[x].tail = -1
    # The children's tokens in a flat array: the root has dozens of
    # children, and a sibling list is a chain of dependent loads.
    tree.child_tok.clear()
    tree.child_id.clear()
    while m >= 0:
        nxt = tree.conts[m].next
        if tree.conts[m].length > d:
            t = tree.toks[tree.conts[m].start + d]
            n = tree.child_tok.size()
            c = -1
            for i in range(n):
                if tree.child_tok[i] == t:
                    c = tree.child_id[i]
                    break
            if c < 0:
                c = _new_child(tree.nodes, x, t, m)
                tree.child_tok.push_back(t)
                tree.child_id.push_back(c)
            _add_member(tree, c, m)
        m = nxt


cdef inline bint _earlier(vector[TrieNode]& nodes, int32_t a, int32_t b) noexcept nogil:
    # Whether a comes before b in merge order: by the first continuation
    # through each, then depth (the order an eager merge created them in).
    if nodes[a].first != nodes[b].first:
        return nodes[a].first < nodes[b].first
    return nodes[a].depth < nodes[b].depth


cdef inline bint _heavier(vector[TrieNode]& nodes, int32_t a, int32_t b) noexcept nogil:
    # Ties go to the node met first (_earlier), so drafts are deterministic.
    if nodes[a].weight != nodes[b].weight:
        return nodes[a].weight > nodes[b].weight
    return _earlier(nodes, a, b)


cdef inline bint _likelier(vector[TrieNode]& nodes, int32_t a, int32_t b) noexcept nogil:
    if nodes[a].score != nodes[b].score:
        return nodes[a].score > nodes[b].score
    return _earlier(nodes, a, b)


cdef inline void _score_children(DraftTree& tree, int32_t parent, double confidence,
                                 vector[int32_t]& frontier) noexcept nogil:
    # P(child | path) = the child's share of the parent's weight, with a
    # pseudo-weight for "something else": thin evidence (few, short matches)
    # is discounted, a long verbatim match is not.
    cdef TrieNode* p
    cdef double scale
    cdef int32_t j
    _expand(tree, parent)
    p = &tree.nodes[parent]
    scale = p.score / (p.weight + confidence)
    j = p.first_child
    while j >= 0:
        tree.nodes[j].score = tree.nodes[j].weight * scale
        frontier.push_back(j)
        j = tree.nodes[j].next_sibling


cdef double _select(DraftTree& tree, int budget, bint one_branch, double confidence,
                    vector[int32_t]& frontier, vector[int32_t]& out_tokens,
                    vector[int32_t]& out_parents) noexcept nogil:
    """Pick the draft: the heaviest chain, or the ``budget`` heaviest nodes.
    Returns the draft's expected accepted tokens: the sum of its nodes' scores,
    each the estimated probability that the target accepts the path to it.

    A node's score never exceeds its parent's, so taking nodes best-first
    from the frontier yields a connected tree whose parents precede children.
    ``frontier`` is scratch.
    """
    cdef int32_t best, c, i, j
    cdef size_t k
    cdef double expected = 0.0, score = 1.0
    frontier.clear()
    out_tokens.clear()
    out_parents.clear()
    if budget <= 0 or tree.nodes[0].head < 0:
        return 0.0
    if one_branch:
        c = 0
        while <int>out_tokens.size() < budget:
            _expand(tree, c)
            best = -1
            j = tree.nodes[c].first_child
            while j >= 0:
                if best < 0 or _heavier(tree.nodes, j, best):
                    best = j
                j = tree.nodes[j].next_sibling
            if best < 0:
                break
            # Scored as a tree's nodes are (_score_children), down the chain.
            score *= tree.nodes[best].weight / (tree.nodes[c].weight + confidence)
            expected += score
            out_parents.push_back(<int32_t>out_tokens.size() - 1)
            out_tokens.push_back(tree.nodes[best].token)
            c = best
        return expected
    tree.nodes[0].score = 1.0
    _score_children(tree, 0, confidence, frontier)
    while <int>out_tokens.size() < budget and frontier.size() > 0:
        best = 0
        for k in range(1, frontier.size()):
            if _likelier(tree.nodes, frontier[k], frontier[best]):
                best = <int32_t>k
        c = frontier[best]
        frontier[best] = frontier[frontier.size() - 1]
        frontier.pop_back()
        tree.nodes[c].slot = <int32_t>out_tokens.size()
        out_tokens.push_back(tree.nodes[c].token)
        expected += tree.nodes[c].score
        i = tree.nodes[c].parent
        out_parents.push_back(tree.nodes[i].slot if i > 0 else <int32_t>-1)
        _score_children(tree, c, confidence, frontier)
    return expected


cdef inline bint _wants_alternatives(const DraftParams* prm, const DraftState* state, int ctx_len) noexcept nogil:
    # Merge the wildcard alternatives (see _draft): a slowly advancing request.
    return prm.wildcard_weight > 0 and _not_copying(prm, state) and ctx_len > 1


cdef double _draft(NativeStore* local, NativeStore* shared,
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
    tree.nodes.clear()
    tree.conts.clear()
    tree.toks.clear()
    tree.nodes.push_back(_leaf(-1, -1, 0, -1))   # the root: the context's last token
    # One shared-lock hold per store: gather its occurrences and merge them.
    # A store that a writer holds at this instant (the inserter indexing a
    # prompt or a share, for at most one 32-position chunk) is skipped rather
    # than waited for; after synchronize() no writer holds one, so drafts
    # stay deterministic.
    if local != NULL and local.mtx.try_lock_shared():
        if state.n >= 0 and local.n > state.n:
            state.pace = PACE_DECAY * state.pace + (1.0 - PACE_DECAY) * <double>(local.n - state.n)
        _prefetch_heads(local, ctx, ctx_len, _wants_alternatives(prm, state, ctx_len))
        _gather(local, ctx, ctx_len, prm, local_weight, one_branch, cands)
        if prm.anchor_window > 0:
            _anchor(local, ctx, ctx_len, prm, local_weight, cands)
        if prm.copy_boost > 0:
            _follow_copy(local, ctx, ctx_len, prm, local_weight, state, cands)
        _weigh_output(prm, state, cands)
        state.n = local.n
        for c in range(cands.size()):
            _merge(local, &cands[c], depth, tree)
        local.mtx.unlock_shared()
    cdef size_t first_shared = cands.size()
    if shared != NULL and <int>cands.size() < prm.max_candidates and shared.mtx.try_lock_shared():
        _prefetch_heads(shared, ctx, ctx_len, _wants_alternatives(prm, state, ctx_len))
        _gather(shared, ctx, ctx_len, prm, 1.0, one_branch, cands)
        for c in range(first_shared, cands.size()):
            _merge(shared, &cands[c], depth, tree)
        shared.mtx.unlock_shared()
    # Nothing matched: the context ends in a token never seen before (a new
    # name, a rare word piece).  What follows it is often what followed the
    # tokens before it elsewhere, whatever came in between.  A request whose
    # drafts have been advancing it slowly (its pace: chat, fresh code) is
    # not copying, and there that evidence also helps when the last token did
    # match, at a small weight; in a request that is copying it would only
    # take slots from the copy.  Nor are they gathered when the direct matches
    # are heavy (a long match): at 1/20 weight they would rank below all of
    # its nodes, and gathering them is a sixth of a draft's cost.
    cdef int skip = 1
    cdef DraftParams fill   # a cheap gather: these alternatives only fill spare slots
    if tree.nodes[0].head >= 0:
        if _wants_alternatives(prm, state, ctx_len) and tree.nodes[0].weight < prm.wildcard_below:
            fill = prm[0]
            fill.max_walk = fill.enough_candidates = prm.wildcard_walk
            fill.top_walk = fill.low_walk = 0
            _merge_past(local, shared, ctx, ctx_len, 1, depth, one_branch, &fill,
                        local_weight * prm.wildcard_weight, prm.wildcard_weight, cands, tree)
    else:
        while tree.nodes[0].head < 0 and skip <= prm.wildcard_tokens and skip < ctx_len:
            _merge_past(local, shared, ctx, ctx_len, skip, depth, one_branch, prm, local_weight, 1.0,
                        cands, tree)
            skip += 1
    return _select(tree, budget, one_branch, prm.confidence, frontier, out_tokens, out_parents)


cdef void _merge_past(NativeStore* local, NativeStore* shared, const int32_t* ctx, int ctx_len, int skip,
                      int depth, bint one_branch, const DraftParams* prm, double local_weight,
                      double shared_weight, vector[Candidate]& cands, DraftTree& tree) noexcept nogil:
    """:func:`_gather_past` on both stores, the shared one only while
    fewer than ``max_candidates`` occurrences are held."""
    cands.clear()
    if local != NULL and local.mtx.try_lock_shared():
        _gather_past(local, ctx, ctx_len, skip, prm, local_weight, one_branch, depth, cands, tree)
        local.mtx.unlock_shared()
    if shared != NULL and <int>cands.size() < prm.max_candidates and shared.mtx.try_lock_shared():
        _gather_past(shared, ctx, ctx_len, skip, prm, shared_weight, one_branch, depth, cands, tree)
        shared.mtx.unlock_shared()


cdef void _gather_past(NativeStore* s, const int32_t* ctx, int ctx_len, int skip, const DraftParams* prm,
                       double store_weight, bint one_branch, int depth, vector[Candidate]& cands,
                       DraftTree& tree) noexcept nogil:
    """Merge the continuations of the context's suffixes that end ``skip``
    tokens before its end, each ``skip`` tokens further on: a draft past
    tokens that match nothing (must hold ``s.mtx``).  An occurrence is
    dropped when a separator falls within the skipped tokens."""
    cdef size_t first = cands.size()
    cdef size_t c
    cdef int j
    cdef bint whole
    _gather(s, ctx, ctx_len - skip, prm, store_weight, one_branch, cands)
    for c in range(first, cands.size()):
        whole = True
        for j in range(1, skip + 1):
            if cands[c].pos + j >= s.n or s.tok[(cands[c].pos + j) & s.mask] < 0:
                whole = False
                break
        if whole:
            cands[c].pos += skip
            _merge(s, &cands[c], depth, tree)


cdef class Drafter:
    """Reusable scratch space for drafting; one per thread of callers.

    Drafts are returned as ``result_type`` instances, a tuple subclass of
    (tokens, parents, expected) such as ``lookahead.cache.Draft``, built here:
    a namedtuple's Python-level constructor cost more than a whole batch's
    other glue."""
    cdef object result_type
    cdef vector[Candidate] cands
    cdef DraftTree tree
    cdef vector[int32_t] frontier
    cdef vector[int32_t] out_tokens
    cdef vector[int32_t] out_parents
    cdef vector[int32_t] ctx
    cdef public int64_t drafts, drafted   # counters for stats()

    def __cinit__(self, type result_type):
        if not issubclass(result_type, tuple):
            raise TypeError(f"result_type must be a tuple subclass, got {result_type!r}")
        self.result_type = result_type

    cdef object _result(self, list tokens, list parents, double expected):
        # tuple.__new__(result_type, (tokens, parents, expected)), without a Python call
        cdef tuple args = ((tokens, parents, expected),)
        return PyTuple_Type.tp_new(self.result_type, <PyObject*>args, NULL)

    def draft_context(self, TokenStore local, TokenStore shared, object context, int budget,
                      bint one_branch, DraftConfig config, int64_t max_id):
        """:meth:`draft` after a whole context (list or int array): only its
        last ``max_match`` ids (``anchor_gap + anchor_min + 32`` if more, for
        re-anchoring) are read and checked."""
        return self._draft_one(local, shared, context, budget, one_branch, config, max_id)

    cdef object _draft_one(self, TokenStore local, TokenStore shared, object context, int budget,
                          bint one_branch, DraftConfig config, int64_t max_id):
        # draft_context's body: a C call for draft_batch, no Python call per request.
        cdef int tail = config.p.max_match
        if config.p.anchor_window > 0 and tail < config.p.anchor_gap + config.p.anchor_min + 32:
            tail = config.p.anchor_gap + config.p.anchor_min + 32
        _read_tokens(context, tail, max_id, self.ctx, "context")
        if self.ctx.size() == 0 or budget <= 0:
            return self._result([], [], 0.0)
        cdef NativeStore* local_s = local.s if local is not None else NULL
        cdef NativeStore* shared_s = shared.s if shared is not None else NULL
        # The request's draft state goes in and out by value, under the GIL.
        cdef DraftState state
        cdef double expected
        _fresh_state(&state)
        if local is not None:
            state = local.draft_state
        with nogil:
            draft_begin()
            expected = _draft(local_s, shared_s, self.ctx.data(), self.ctx.size(), budget,
                              one_branch, &config.p, &state, self.cands, self.tree,
                              self.frontier, self.out_tokens, self.out_parents)
            draft_end()
        if local is not None:
            local.draft_state = state
        self.drafts += 1
        self.drafted += self.out_tokens.size()
        return self._result(list(self.out_tokens), list(self.out_parents), expected)

    def draft_batch(self, list locals_, list shareds, list contexts, int budget,
                    bint one_branch, DraftConfig config, int64_t max_id):
        """:meth:`draft_context` for many requests, in a list: request i
        drafts from ``locals_[i]`` and ``shareds[i]`` (its scope's history,
        or None)."""
        cdef Py_ssize_t i
        out = []
        draft_begin()   # the whole batch, glue included, has priority over indexing
        try:
            for i in range(len(contexts)):
                out.append(self._draft_one(locals_[i], shareds[i], contexts[i], budget,
                                           one_branch, config, max_id))
        finally:
            draft_end()
        return out
