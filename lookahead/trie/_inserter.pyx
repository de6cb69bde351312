# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, nonecheck=False
"""The inserter: the background writer of the token stores, and the drafts it yields to.

What a store holds and how it is indexed is ``_store.pyx``'s; *when* and on
which thread the long writes happen is this module's.  A prompt is appended
raw by the caller and indexed later, and the output shared into a scope's
history is appended and indexed later too, both by one native thread
(``InsertThread`` in ``_native.hpp``) that applies them in submission order
and never takes the GIL, so a decode step never waits for them.

That thread must not slow the drafts either: while any draft is running in
the process, it waits before each chunk of a prompt it indexes (see
yield_to_drafts in ``_native.hpp``).  So the count of running drafts
(``begin_draft`` / ``end_draft``, which every draft calls) lives here, in the
same extension module as the thread that reads it and the thread-local flag
by which that thread knows itself: the statics of ``_native.hpp``'s inline
functions are one copy per extension module unless the toolchain merges
them (GCC does, as unique symbols; clang does not), and these must be one.
"""

from libc.stdint cimport int32_t, int64_t, uint64_t
from libcpp.vector cimport vector

from lookahead.trie._native cimport SEPARATOR, NativeStore, StorePtr
from lookahead.trie._store cimport TokenStore, _check_resize, _index_chunk, _store_append_chunked


# The insert thread, with the count of running drafts it yields to (one
# count per process: it lives in this module only), and resizing, which the
# thread applies itself.
cdef extern from "_native.hpp" namespace "lookahead" nogil:
    void resize_store(NativeStore* s, int64_t new_cap) except +
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


cdef void begin_draft() noexcept nogil:
    draft_begin()


cdef void end_draft() noexcept nogil:
    draft_end()


def drafts_running():
    """Drafts in progress in this process (the insert thread yields to them)."""
    return drafts_in_progress()


cdef void _catch_up(NativeStore* s) noexcept nogil:
    """Index everything appended so far (a prompt), one chunk per lock hold,
    each after any running draft (see yield_to_drafts in _native.hpp)."""
    cdef int64_t done = 1
    while done > 0:
        yield_to_drafts()
        done = _index_chunk(s)


cdef void _apply_insert(NativeStore* s, const int32_t* tokens, int64_t count, bint index_pending) noexcept nogil:
    # The inserter thread's job body (see InsertThread in _native.hpp).
    if index_pending:
        _catch_up(s)
    elif count > 0:
        _store_append_chunked(s, tokens, count)


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
