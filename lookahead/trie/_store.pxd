# The token stores (see _store.pyx), as the drafting and inserter modules see them.

from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from lookahead.trie._native cimport NativeStore, StorePtr


cdef enum:
    INITIAL_PACE = 2   # a new request's pace, in tokens per draft (see _draft in _drafting.pyx)


cdef struct DraftState:
    # What a request's drafts carry from one step to the next (kept with its store).
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


cdef class TokenStore:
    cdef StorePtr ptr
    cdef NativeStore* s
    cdef DraftState draft_state   # read and written by drafts, with the GIL held

    cdef int _out_of_memory(self, int64_t count) except -1
    cdef int _check_writable(self) except -1
    cdef void _copy(self, int64_t start, int64_t end, vector[int32_t]& out) noexcept nogil
    cdef StoreCounts _counts(self) noexcept nogil


# What the Inserter (_inserter.pyx) applies to a store, on its thread or on
# the caller's: a share's append, a prompt's indexing chunk by chunk, and
# the check of a resize before it is queued.
cdef void _store_append_chunked(NativeStore* s, const int32_t* src, int64_t count) noexcept nogil
cdef int64_t _index_chunk(NativeStore* s) noexcept nogil
cdef int _check_resize(TokenStore store, int64_t capacity) except -1
