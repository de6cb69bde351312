# The draft trie (see _draft_tree.pyx), as the drafting module fills and reads it.

from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from lookahead.trie._native cimport NativeStore


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
    # nodes[0] is the root (the context's last token); its ``head`` is -1
    # until a continuation is merged, and its ``weight`` sums theirs.
    vector[TrieNode] nodes
    vector[Continuation] conts
    vector[int32_t] toks
    vector[int32_t] child_tok, child_id   # scratch of _expand


cdef void _reset(DraftTree& tree) noexcept nogil
cdef void _merge(NativeStore* s, int64_t pos, double weight, int depth, DraftTree& tree) noexcept nogil
cdef double _select(DraftTree& tree, int budget, bint one_branch, double confidence, double min_score,
                    vector[int32_t]& frontier, vector[int32_t]& out_tokens,
                    vector[int32_t]& out_parents, vector[double]& out_scores) noexcept nogil
