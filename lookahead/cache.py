"""``LookaheadCache``: the drafting API that the SGLang worker and users drive.

It owns one shared history (a bounded ring of every request's output, the
cross-request n-gram source) and one store per live request (its whole prompt
plus its output, the copy source).  Prompts and shared-history inserts are
applied by a native background thread that never takes the GIL; a request's
own new tokens go into its store at once, since they are few and the very
next draft needs them.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from typing import Any, Hashable, NamedTuple, Sequence

import numpy as np

from lookahead._trie import DraftConfig, Drafter, Inserter, TokenStore, read_tokens
from lookahead.host import memory_short_of
from lookahead.tokens import MAX_TOKEN_ID, check_budget

_FORMAT_VERSION = 1


class Draft(NamedTuple):
    """A draft tree in topological order.

    ``parents[i] == -1``: token ``i`` follows the context's last token;
    otherwise it follows token ``parents[i]`` (always an earlier index).  A
    one-branch draft is a chain: ``parents == [-1, 0, 1, ...]``.
    """

    tokens: list
    parents: list

    def __len__(self) -> int:  # number of draft tokens
        return len(self.tokens)


@dataclass(frozen=True)
class LookaheadConfig:
    """Every knob of the cache; the defaults are the tuned ones (see README)."""

    max_memory_bytes: int = 256 << 20  # shared history budget, index included
    orders: tuple = (1, 2, 4, 8)  # n-gram orders indexed for matching
    max_match_len: int = 64  # longest context suffix compared to an occurrence
    max_walk: int = 16  # occurrences visited per order and store
    top_walk: int = 64  # ... for the highest order in a request's own store (find the right copy source)
    low_walk: int = 32  # ... for orders 1 and 2 of the shared history in multi-branch drafts (better odds for the alternatives)
    max_candidates: int = 64  # occurrences merged into one draft
    enough_candidates: int = 12  # stop trying shorter suffixes after this many
    match_exponent: float = 2.0  # occurrence weight = match_len ** exponent
    local_weight: float = 4.0  # the request's own stream weighs this much more (trees)
    chain_local_weight: float = 6.0  # ... in one-branch drafts (a chain wants the likeliest single continuation)
    min_match_len: int = 1  # ignore occurrences matching fewer tokens
    confidence: float = 8.0  # pseudo-weight discounting branches seen few times
    order_norm: float = 0.0  # 1: each n-gram order weighs the same however many hits it has
    anchor_window: int = 384  # re-anchor a copy after an edit: source tokens searched (0: off)
    anchor_below: int = 4  # ... when the best match in the request's own stream is shorter
    anchor_gap: int = 14  # ... skipping at most this many diverged context tokens
    anchor_min: int = 12  # ... behind an anchor verified over at least this many tokens
    copy_boost: float = 4.0  # weight of the copy the request's drafts are following, among equally long matches (0: off)
    mismatch_weight: float = 0.5  # the request's own stream: a match goes on past one mismatch, tokens beyond it counting this much (0: off)
    wildcard_tokens: int = 2  # nothing matches the context: draft past its last 1, then 2 tokens as if they were any (0: off)
    wildcard_weight: float = 0.05  # ... and past its last token at this weight, in requests whose pace is below:
    wildcard_pace: float = 2.5  # tokens a request advances per draft, moving average (low: not copying)
    wildcard_walk: int = 7  # ... gathered cheaply: this many occurrences per order walked and enough
    wildcard_below: float = 400.0  # ... and only while the direct matches weigh less than this (a 10-token match in the request's own stream)
    output_weight: float = 2.0  # a request below wildcard_pace: its own output weighs this much more than its prompt
    share_outputs: bool = True  # feed outputs into the shared history
    share_prompt_tail: int = 24  # prompt tokens shared before the output, as its context (the question's end)
    flush_tokens: int = 128  # share a running request's output every this many tokens
    vocab_size: int | None = None  # reject ids >= vocab_size when set
    background: bool = True  # False: apply inserts inline (debugging)

    def __post_init__(self):
        def positive(name):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        for name in ("max_memory_bytes", "max_match_len", "max_walk", "max_candidates",
                     "enough_candidates", "min_match_len", "flush_tokens", "top_walk", "low_walk",
                     "anchor_below", "anchor_gap", "anchor_min", "wildcard_walk"):
            positive(name)
        for name in ("anchor_window", "wildcard_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.max_memory_bytes < 1 << 16:
            raise ValueError(f"max_memory_bytes must be at least 64 KiB, got {self.max_memory_bytes}")
        physical = memory_short_of(self.max_memory_bytes)
        if physical:
            # Allocating it could succeed (overcommit) and then get the
            # process killed when the history is zeroed: refuse it here.
            raise ValueError(f"max_memory_bytes ({self.max_memory_bytes:,} bytes) is more than this "
                             f"machine's memory ({physical:,} bytes)")
        orders = tuple(self.orders)
        if not orders or any(not isinstance(o, int) or o < 1 for o in orders) or list(orders) != sorted(set(orders)):
            raise ValueError(f"orders must be increasing positive integers, got {self.orders!r}")
        if len(orders) > 8:
            raise ValueError(f"at most 8 n-gram orders are supported, got {len(orders)}")
        object.__setattr__(self, "orders", orders)
        if self.match_exponent < 0 or self.local_weight <= 0 or self.chain_local_weight <= 0 or self.confidence < 0:
            raise ValueError("match_exponent and confidence must be >= 0, local_weight and chain_local_weight > 0")
        for name in ("copy_boost", "mismatch_weight", "wildcard_weight", "wildcard_pace", "wildcard_below"):
            if not getattr(self, name) >= 0:  # NaN fails too
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.output_weight > 0 or self.output_weight == float("inf"):
            raise ValueError(f"output_weight must be a positive finite number, got {self.output_weight!r}")
        if self.share_prompt_tail < 0:
            raise ValueError(f"share_prompt_tail must be >= 0, got {self.share_prompt_tail}")
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size < 1):
            raise ValueError(f"vocab_size must be a positive integer or None, got {self.vocab_size!r}")

    @property
    def shared_capacity(self) -> int:
        """Tokens the shared ring holds: the largest power of two whose stream
        and index (4 bytes per order for chains, 2 for hash heads) fit."""
        per_token = 4 + 6 * len(self.orders)
        tokens = max(16, self.max_memory_bytes // per_token)
        return 1 << (tokens.bit_length() - 1)


@dataclass
class _Request:
    store: TokenStore  # the prompt, then the output as it is accepted
    prompt_len: int
    shared_upto: int  # store position up to which the output is in the shared history


class LookaheadCache:
    """Drafts continuations from everything the server has seen.

    Typical use (one call per scheduler step)::

        cache.put_prompt(rid, prompt_ids)            # when prefill is scheduled
        d = cache.draft(rid, context, budget)        # before each verify
        cache.put_output(rid, accepted_ids)          # after each verify
        cache.finish(rid)                            # on completion or abort

    Thread-safe: calls may come from several threads; a draft racing with
    ``finish`` of the same request either completes or raises ``ValueError``.
    """

    def __init__(self, config: LookaheadConfig | None = None, **overrides: Any):
        if config is None:
            config = LookaheadConfig(**overrides)
        elif overrides:
            config = LookaheadConfig(**{**asdict(config), **overrides})
        self.config = config
        self._draft_config = DraftConfig(
            max_match=config.max_match_len,
            max_walk=config.max_walk,
            max_candidates=config.max_candidates,
            enough_candidates=config.enough_candidates,
            match_exponent=config.match_exponent,
            local_weight=config.local_weight,
            chain_local_weight=config.chain_local_weight,
            min_match=config.min_match_len,
            confidence=config.confidence,
            order_norm=config.order_norm,
            top_walk=config.top_walk,
            low_walk=config.low_walk,
            anchor_window=config.anchor_window,
            anchor_below=config.anchor_below,
            anchor_gap=config.anchor_gap,
            anchor_min=config.anchor_min,
            copy_boost=config.copy_boost,
            wildcard_tokens=config.wildcard_tokens,
            mismatch_weight=config.mismatch_weight,
            wildcard_weight=config.wildcard_weight,
            wildcard_pace=config.wildcard_pace,
            wildcard_walk=config.wildcard_walk,
            wildcard_below=config.wildcard_below,
            output_weight=config.output_weight,
        )
        self._max_id = MAX_TOKEN_ID if config.vocab_size is None else config.vocab_size - 1
        self._shared = TokenStore(config.shared_capacity, True, config.orders)
        self._requests: dict[Hashable, _Request] = {}
        self._lock = threading.Lock()
        self._inserter = Inserter(config.background)
        self._scratch = threading.local()
        self._drafters: list[Drafter] = []
        self._prompts = self._prompt_tokens = self._output_tokens = self._finished = 0

    # -- feeding -------------------------------------------------------------

    def put_prompt(self, rid: Hashable, tokens: Any) -> None:
        """Index a new request's whole prompt (in the background)."""
        arr = read_tokens(tokens, self._max_id, "prompt")
        store = TokenStore(max(1024, 2 * len(arr) + 256), False, self.config.orders)
        # The raw copy is a memcpy; the indexing is the expensive part.
        store.append_tokens(arr, False)
        store.mark_prompt_end()
        with self._lock:
            if rid in self._requests:
                raise ValueError(f"request {rid!r} already has a prompt; call finish() before reusing its id")
            self._requests[rid] = _Request(store, len(arr), len(arr))
            self._prompts += 1
            self._prompt_tokens += len(arr)
        self._inserter.index_pending(store)

    def put_output(self, rid: Hashable, tokens: Any) -> None:
        """Give the request's newly accepted tokens (visible to its next draft)."""
        req = self._requests.get(rid)
        if req is None:
            raise ValueError(f"unknown request {rid!r}: call put_prompt() first")
        req.store.append_checked(tokens, self._max_id, "output")
        if self.config.share_outputs and req.store.appended - req.shared_upto >= self.config.flush_tokens:
            self._share(req)

    def finish(self, rid: Hashable) -> None:
        """The request completed or was aborted: share its output, free its store."""
        with self._lock:
            req = self._requests.pop(rid, None)
            if req is None:
                raise ValueError(f"unknown request {rid!r}: finish() needs a put_prompt() first")
            self._finished += 1
            # Output tokens are counted from the store itself (no per-step bookkeeping).
            self._output_tokens += req.store.appended - req.prompt_len
        if self.config.share_outputs:
            self._share(req)

    def _share(self, req: _Request) -> None:
        # A separator keeps n-grams from spanning requests; the tokens just
        # before the new output (the prompt's tail, or the last shared output)
        # give its first tokens their context.
        with self._lock:
            start, end = req.shared_upto, req.store.appended
            if end <= start:
                return
            context = self.config.share_prompt_tail if start == req.prompt_len else max(self.config.orders)
            req.shared_upto = end
        self._inserter.share(self._shared, req.store, start, end, context)

    def synchronize(self) -> None:
        """Wait until every insert submitted so far is visible to drafts."""
        self._inserter.synchronize()

    # -- drafting ------------------------------------------------------------

    def _drafter(self) -> Drafter:
        try:
            return self._scratch.drafter
        except AttributeError:
            drafter = self._scratch.drafter = Drafter(Draft)
            with self._lock:
                self._drafters.append(drafter)
            return drafter

    def draft(self, rid: Hashable, context: Any, budget: int, one_branch: bool = False) -> Draft:
        """Draft at most ``budget`` tokens after ``context`` (prompt + output so far).

        Only the context's last ``max_match_len`` ids are read.  An empty draft
        means nothing matched.
        """
        budget = check_budget(budget)
        req = self._requests.get(rid)
        if req is None:
            raise ValueError(f"unknown request {rid!r}: call put_prompt() first")
        return self._drafter().draft_context(req.store, self._shared, context, budget,
                                             one_branch, self._draft_config, self._max_id)

    def batch_draft(self, rids: Sequence[Hashable], contexts: Sequence[Any], budget: int,
                    one_branch: bool = False) -> list[Draft]:
        """:meth:`draft` for a batch in one call."""
        budget = check_budget(budget)
        if len(rids) != len(contexts):
            raise ValueError(f"batch_draft got {len(rids)} rids but {len(contexts)} contexts")
        stores = []
        for rid in rids:
            req = self._requests.get(rid)
            if req is None:
                raise ValueError(f"unknown request {rid!r}: call put_prompt() first")
            stores.append(req.store)
        return self._drafter().draft_batch(stores, self._shared, list(contexts), budget, one_branch,
                                           self._draft_config, self._max_id)

    # -- introspection and persistence ----------------------------------------

    def __contains__(self, rid: Hashable) -> bool:
        return rid in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def stats(self) -> dict:
        """Sizes and counters, for logs, metrics and benchmarks."""
        with self._lock:
            live = list(self._requests.values())
            stores = [r.store for r in live]
            drafters = list(self._drafters)
        local_bytes = sum(s.nbytes for s in stores)
        return {
            "prompts": self._prompts,
            "prompt_tokens": self._prompt_tokens,
            "output_tokens": self._output_tokens + sum(r.store.appended - r.prompt_len for r in live),
            "finished": self._finished,
            "drafts": sum(d.drafts for d in drafters),
            "draft_tokens": sum(d.drafted for d in drafters),
            "active_requests": len(stores),
            "local_tokens": sum(s.size for s in stores),
            "local_bytes": local_bytes,
            "shared_tokens": self._shared.size,
            "shared_tokens_seen": self._shared.appended,
            "shared_capacity": self._shared.capacity,
            "shared_bytes": self._shared.nbytes,
            "total_bytes": self._shared.nbytes + local_bytes,
            "pending_inserts": self._inserter.pending(),
            "failed_inserts": self._inserter.failures,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the shared history (not live requests) to ``path`` (.npz)."""
        self.synchronize()
        meta = {"format": _FORMAT_VERSION, "config": {**asdict(self.config), "orders": list(self.config.orders)}}
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "wb") as f:
            np.savez_compressed(f, shared=self._shared.tokens(), meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike, **overrides: Any) -> "LookaheadCache":
        """A cache whose shared history is the one saved at ``path``."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(bytes(data["meta"]).decode())
                shared = np.ascontiguousarray(data["shared"], dtype=np.int32)
            if meta.get("format") != _FORMAT_VERSION:
                raise ValueError(f"unsupported lookahead cache format {meta.get('format')!r}")
            config = dict(meta["config"], orders=tuple(meta["config"]["orders"]))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: not a saved LookaheadCache ({type(exc).__name__}: {exc})") from None
        config.update(overrides)
        cache = cls(LookaheadConfig(**config))
        if shared.size and (shared.min() < -1 or (cache.config.vocab_size and shared.max() >= cache.config.vocab_size)):
            raise ValueError(f"{path}: saved history holds ids outside the vocabulary")
        cache._shared.append_indexed(shared)
        return cache

    def close(self) -> None:
        """Finish pending inserts and stop the background thread."""
        self._inserter.close()
