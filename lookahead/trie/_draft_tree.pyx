# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False, nonecheck=False
"""The draft trie: continuations merged into a small explicit trie, and the draft chosen from it.

Drafting (``_drafting.pyx``, with ``_matching.pyx``) finds occurrences of
the context in the token stores and weighs them; each occurrence's
continuation, the tokens that followed it, is merged here into a trie whose
nodes weigh as much as the continuations through them.  A node's *score* estimates the probability
that the target accepts the path to it: its share of its parent's weight,
with a pseudo-weight ``confidence`` for "something else", so that thin
evidence ranks below a long verbatim match.  A multi-branch draft is the
``budget`` best-scoring nodes (a connected tree, since a node never scores
above its parent); a one-branch draft follows the heaviest child down.

The trie is built lazily: a continuation is copied out of its store at
once (the store is locked only then), but a node's children are made only
when the selection reaches it, since most of a full merge would lie deep in
branches never chosen.  Ties are broken by merge order everywhere, so
drafts are deterministic.
"""

from libc.stdint cimport int32_t, int64_t
from libcpp.vector cimport vector

from lookahead.trie._native cimport NativeStore


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


cdef void _reset(DraftTree& tree) noexcept nogil:
    # An empty draft trie: the root alone (the context's last token).
    tree.nodes.clear()
    tree.conts.clear()
    tree.toks.clear()
    tree.nodes.push_back(_leaf(-1, -1, 0, -1))


cdef void _merge(NativeStore* s, int64_t pos, double weight, int depth, DraftTree& tree) noexcept nogil:
    """Add the continuation of the occurrence ending at ``pos`` (up to
    ``depth`` tokens, weighing ``weight``) to the draft trie: copied out of
    the store, which must be locked (``s.mtx``), to be expanded by _expand
    as far as the selection needs."""
    cdef int64_t q = pos + 1
    cdef int32_t t
    cdef int i
    cdef Continuation cont
    cont.start = <int32_t>tree.toks.size()
    cont.weight = weight
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

    Merging every continuation to its full depth up front would make many
    nodes per draft, most of them deep in branches the selection never
    reaches.  Weights are summed in merge order and ties broken by merge
    order (_earlier), as a full merge would, so the drafts are the same as
    its (and as the reference model's, which merges eagerly)."""
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


cdef double _select(DraftTree& tree, int budget, bint one_branch, double confidence, double min_score,
                    vector[int32_t]& frontier, vector[int32_t]& out_tokens,
                    vector[int32_t]& out_parents, vector[double]& out_scores) noexcept nogil:
    """Pick the draft: the heaviest chain, or the ``budget`` heaviest nodes.
    Returns the draft's expected accepted tokens: the sum of its nodes' scores,
    each the estimated probability that the target accepts the path to it;
    ``out_scores`` gets each node's (non-increasing: best-first), so a batch
    can trim its drafts to the width worth verifying.

    A node scoring below ``min_score`` is not drafted: where verifying a
    token costs something (a compute-bound forward, as on a CPU), a node
    the target will likely reject costs more than it is expected to bring.

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
    out_scores.clear()
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
            if score < min_score:
                break
            expected += score
            out_scores.push_back(score)
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
        if tree.nodes[c].score < min_score:
            break  # the best left; every other scores as low or lower
        frontier[best] = frontier[frontier.size() - 1]
        frontier.pop_back()
        tree.nodes[c].slot = <int32_t>out_tokens.size()
        out_tokens.push_back(tree.nodes[c].token)
        expected += tree.nodes[c].score
        out_scores.push_back(tree.nodes[c].score)
        i = tree.nodes[c].parent
        out_parents.push_back(tree.nodes[i].slot if i > 0 else <int32_t>-1)
        _score_children(tree, c, confidence, frontier)
    return expected
