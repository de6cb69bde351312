"""The drafters LOOKAHEAD is measured against, behind one small interface.

Each adapter drives its drafter the way its own serving stack does, so that
the acceptance replay compares algorithms rather than integrations:

* ``ngram``: SGLang's NGRAM corpus, fed and queried exactly as
  ``ngram_worker.py`` does (the last ``max_trie_depth`` tokens are inserted
  after every step, then matched with ``draft_token_num = budget + 1``).
* ``prompt-lookup``: vLLM's n-gram proposer: the longest context suffix of
  5 down to 2 tokens, its earliest earlier occurrence, the tokens after it.
* ``suffix`` / ``suffix-path``: Snowflake's SuffixDecoding (tree and path
  speculation), when ``arctic_inference`` is importable.
* ``lookahead`` / ``lookahead-1b``: this package, multi- and one-branch.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class ReplayDrafter(Protocol):
    """The request lifecycle the replay drives; drafts are (tokens, parents)
    with ``parents[i] == -1`` for children of the context's last token.
    (``LookaheadDrafter.start`` also takes the request's ``scope``.)"""

    name: str

    def start(self, rid: int, prompt: np.ndarray) -> None: ...

    def draft(self, rid: int, context: np.ndarray, budget: int) -> tuple[list, list]: ...

    def accept(self, rid: int, context: np.ndarray, new_tokens: np.ndarray) -> None: ...

    def finish(self, rid: int) -> None: ...


class LookaheadDrafter:
    """``share=False``: requests share no history (each drafts from its own
    prompt and output only).  ``config``: ``LookaheadCache``'s keywords, the
    options of ``LookaheadConfig`` and ``tuning`` (a ``DraftTuning``, to
    replay other ranking weights)."""

    def __init__(self, one_branch: bool = False, share: bool = True, **config):
        from lookahead.trie.cache import LookaheadCache

        self.name = "lookahead-1b" if one_branch else "lookahead"
        self.one_branch = one_branch
        self.share = share
        self.cache = LookaheadCache(**config)

    def start(self, rid, prompt, scope=None):
        self.cache.put_prompt(rid, prompt, scope=scope, share=self.share)
        # A server drafts only after the prompt's prefill, which takes far
        # longer than indexing it; wait here so replays are deterministic.
        self.cache.synchronize()

    def draft(self, rid, context, budget):
        return self.cache.draft(rid, context, budget, self.one_branch)

    def accept(self, rid, context, new_tokens):
        self.cache.put_output(rid, new_tokens)
        # Every 128 tokens the output is shared in the background; wait for it
        # (usually a no-op) so a replay's drafts never depend on thread timing.
        self.cache.synchronize()

    def finish(self, rid):
        self.cache.finish(rid)


class NgramDrafter:
    """SGLang's NGRAM with its server defaults."""

    name = "ngram"

    def __init__(self, budget: int, max_trie_depth: int = 18, min_bfs_breadth: int = 1,
                 max_bfs_breadth: int = 10, match_type: str = "BFS", capacity: int = 10_000_000):
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        self.depth = max_trie_depth
        self.width = budget + 1  # NGRAM counts the root (the last context token)
        self.corpus = NgramCorpus(max_trie_depth=max_trie_depth, min_bfs_breadth=min_bfs_breadth,
                                  max_bfs_breadth=max_bfs_breadth, draft_token_num=self.width,
                                  match_type=match_type, capacity=capacity)

    def start(self, rid, prompt):
        pass

    def draft(self, rid, context, budget):
        self.corpus.synchronize()
        tail = context[-self.depth:].tolist()
        ids, mask = self.corpus.batch_get([str(rid)], [tail], [len(context)])
        return tree_from_mask(ids, mask, self.width)

    def accept(self, rid, context, new_tokens):
        self.corpus.batch_put([context[-self.depth:].tolist()])

    def finish(self, rid):
        self.corpus.erase_match_state([str(rid)])


def tree_from_mask(ids: np.ndarray, mask: np.ndarray, width: int) -> tuple[list, list]:
    """NGRAM's (root + drafts, ancestor mask) -> our (tokens, parents).

    Node i's parent is its nearest ancestor j < i; node 0 is the root.
    Padding nodes are kept: SGLang verifies them too.
    """
    mask = mask.reshape(width, width)
    tokens, parents = [], []
    for i in range(1, width):
        ancestors = np.flatnonzero(mask[i, :i])
        parent = int(ancestors[-1]) if ancestors.size else 0
        tokens.append(int(ids[i]))
        parents.append(parent - 1)
    return tokens, parents


class PromptLookupDrafter:
    """vLLM-style prompt lookup over the request's own context."""

    name = "prompt-lookup"

    def __init__(self, max_n: int = 5, min_n: int = 2):
        self.max_n, self.min_n = max_n, min_n

    def start(self, rid, prompt):
        pass

    def draft(self, rid, context, budget):
        length = len(context)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = context[length - n:]
            hits = np.flatnonzero(context[: length - n] == suffix[0])
            for j in range(1, n):
                if not hits.size:
                    break
                hits = hits[context[hits + j] == suffix[j]]
            if hits.size:
                start = int(hits[0]) + n
                tokens = context[start:start + budget].tolist()
                return tokens, list(range(-1, len(tokens) - 1))
        return [], []

    def accept(self, rid, context, new_tokens):
        pass

    def finish(self, rid):
        pass


def suffix_available() -> bool:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401  (availability probe)
    except Exception:
        return False
    return True


class SuffixDrafter:
    """SuffixDecoding with its upstream defaults; ``path=True`` drafts a chain."""

    def __init__(self, path: bool = False, max_tree_depth: int = 64, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.name = "suffix-path" if path else "suffix"
        self.tree = not path
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth)

    def start(self, rid, prompt):
        self.cache.start_request(rid, prompt)

    def draft(self, rid, context, budget):
        draft = self.cache.speculate(rid, context, max_spec_tokens=budget,
                                     max_spec_factor=self.max_spec_factor,
                                     min_token_prob=self.min_token_prob,
                                     use_tree_spec=self.tree)
        return list(draft.token_ids), list(draft.parents)

    def accept(self, rid, context, new_tokens):
        self.cache.add_active_response(rid, new_tokens)

    def finish(self, rid):
        self.cache.stop_request(rid)
