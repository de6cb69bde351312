# The inserter (see _inserter.pyx), as the drafting module sees it.

# Bracket a draft, or a batch of them: the insert thread yields to drafts
# while any is running (see yield_to_drafts in _native.hpp).  The count
# lives in _inserter.pyx only, so every draft must go through these two.
cdef void begin_draft() noexcept nogil
cdef void end_draft() noexcept nogil
