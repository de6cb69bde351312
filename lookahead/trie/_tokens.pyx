# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, nonecheck=False
"""Token ids in: read and checked natively, for every input of the cache.

Every prompt, output and drafting context comes through here, and a
context comes every step for every request, so checking each id in Python
(an int, not a bool, inside the vocabulary) would cost more than the draft.
Lists, tuples and int32/int64 arrays are read in C, only as far back as a
draft looks; anything else falls back to ``lookahead.trie.tokens.as_token_array``,
so that every input gets the same checks and the same messages.
"""

from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from cpython.object cimport PyObject, PyTypeObject

import numpy as np
cimport numpy as cnp

cnp.import_array()


cdef object _as_token_array = None

cdef extern from "Python.h":
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
    through ``lookahead.trie.tokens.as_token_array`` for its checks and messages."""
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
            # An exact int in range is read in C, without Python comparisons
            # (a worker's contexts are lists, read every step).  The GIL is
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
        from lookahead.trie.tokens import as_token_array
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
