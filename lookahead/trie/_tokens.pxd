# The native reader of token ids (see _tokens.pyx), for the other modules.

from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector


cdef int _read_tokens(object src, Py_ssize_t tail, int64_t max_id, vector[int32_t]& out,
                      str what) except -1
