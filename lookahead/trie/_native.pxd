# What every native module of the trie shares: the token store as C++ holds
# it (``_native.hpp``), the n-gram hash, and the constants that the writers
# (``_store.pyx``) and the readers (``_matching.pyx``) must agree on.
#
# A store is written by one module and read by another, so its layout and
# the hash that keys its chains are declared once, here.  Only declarations
# and small inline functions live in a .pxd: each module that cimports it
# compiles them in, so the hot paths call no function through a pointer for
# them.  The inserter thread and the count of running drafts are not here:
# they belong to ``_inserter.pyx`` alone (one copy of each in the process).

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.memory cimport shared_ptr
from libcpp.vector cimport vector


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
        uint32_t frozen
        vector[vector[uint32_t]] cstart
        vector[vector[uint32_t]] occ
        int norders
        int orders[8]
        shared_mutex mtx
    ctypedef shared_ptr[NativeStore] StorePtr
    int64_t store_base(const NativeStore* s)
    uint32_t chain_head(const NativeStore* s, int o, uint32_t key)
    const void* chain_head_address(const NativeStore* s, int o, uint32_t key)


cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil


cdef enum:
    MAX_ORDERS = 8
    SEPARATOR = -1   # between requests in a shared history (never a token)


cdef inline uint64_t hash_step(uint64_t h, int32_t token) noexcept nogil:
    # One more token (going back from an n-gram's last one) into its hash:
    # the indexer keys chains by it and drafts look them up by it, so both
    # must use this one function.
    return (h ^ <uint32_t>token) * 0x9E3779B97F4A7C15ULL
