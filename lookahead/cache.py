"""``LookaheadCache``: the drafting API that the SGLang worker and users drive.

It owns one shared history per scope (the cross-request n-gram source: the
outputs of the scope's requests; see ``lookahead.scopes`` for how they share
one memory budget) and one store per live request (its whole prompt plus its
output, the copy source).  A request drafts from its own store and its
scope's history only.  Prompts and shared-history inserts are applied by a
native background thread that never takes the GIL; a request's own new
tokens go into its store at once, since they are few and the very next
draft needs them.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, Hashable, NamedTuple, Optional, Sequence

import numpy as np

from lookahead._drafting import DraftConfig, Drafter
from lookahead._store import Inserter, TokenStore
from lookahead._tokens import read_tokens
from lookahead.host import memory_short_of
from lookahead.scopes import Drop, ScopeBudget, check_scope
from lookahead.tokens import MAX_TOKEN_ID, check_budget

logger = logging.getLogger(__name__)

# 1: one shared history ("shared"); 2: one per scope ("tokens" split by
# "lengths", the scopes named in the meta, least recently used first).
_FORMAT_VERSION = 2

# The scope of a request that shares no history (put_prompt(share=False)):
# no scope is ever keyed by it, so its drafts find no shared history.
_PRIVATE = object()

# Set to a file path, every draft is appended to it as a JSON line (request,
# scope, its stream length, context tail, draft): what the end-to-end tests
# check isolation with, in a real server.  Unset, drafting is untouched.
DRAFT_LOG_ENV = "LOOKAHEAD_DRAFT_LOG"


class Draft(NamedTuple):
    """A draft tree in topological order.

    ``parents[i] == -1``: token ``i`` follows the context's last token;
    otherwise it follows token ``parents[i]`` (always an earlier index).  A
    one-branch draft is a chain: ``parents == [-1, 0, 1, ...]``.
    ``expected``: the tokens the target is expected to accept from it, the
    sum over its nodes of the trie's estimate that the path to the node is
    accepted (what the worker weighs a draft's cost against).
    """

    tokens: list
    parents: list
    expected: float = 0.0

    def __len__(self) -> int:  # number of draft tokens
        return len(self.tokens)


@dataclass(frozen=True)
class LookaheadConfig:
    """Every knob of the cache; the defaults are the tuned ones (see README)."""

    max_memory_bytes: int = 256 << 20  # shared histories' budget (all scopes), index included
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
        """Tokens one scope's history holds at most (all of them, when there
        is one scope): the largest power of two whose stream and index (4
        bytes per order for chains, 2 for hash heads) fit."""
        per_token = 4 + 6 * len(self.orders)
        tokens = max(16, self.max_memory_bytes // per_token)
        return 1 << (tokens.bit_length() - 1)


@dataclass
class _Request:
    store: TokenStore  # the prompt, then the output as it is accepted
    prompt_len: int
    shared_upto: int  # store position up to which the output is in the shared history
    scope: Any = None  # its scope's key (_PRIVATE: it shares nothing)


class LookaheadCache:
    """Drafts continuations from everything the server has seen.

    Typical use (one call per scheduler step)::

        cache.put_prompt(rid, prompt_ids, scope=tenant)   # when prefill is scheduled
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
        self._budget = ScopeBudget(config.max_memory_bytes, config.shared_capacity, len(config.orders))
        self._scopes = self._budget.scopes  # key -> Scope
        # key -> its history's store, for drafts (read without the lock: a
        # dict lookup per request and step; a dropped store lives on while
        # a draft holds it).  Kept in step with the budget's scopes.
        self._histories: dict[Any, TokenStore] = {}
        self._requests: dict[Hashable, _Request] = {}
        self._lock = threading.Lock()
        self._inserter = Inserter(config.background)
        self._scratch = threading.local()
        self._drafters: list[Drafter] = []
        self._prompts = self._prompt_tokens = self._output_tokens = self._finished = 0
        self._saver = _Saver(self)
        log = os.environ.get(DRAFT_LOG_ENV)
        if log:
            self._log = _DraftLog(log)
            self.draft = self._logged_draft
            self.batch_draft = self._logged_batch_draft

    # -- feeding -------------------------------------------------------------

    def put_prompt(self, rid: Hashable, tokens: Any, *, scope: Optional[str] = None, share: bool = True) -> None:
        """Index a new request's whole prompt (in the background).

        The request drafts from its own prompt and output and from its
        ``scope``'s shared history (a ``str``, or ``None`` for the default
        scope), and its output enters that history only.  ``share=False``:
        it neither drafts from nor feeds any shared history."""
        scope = check_scope(scope)
        if type(share) is not bool:
            raise TypeError(f"share must be a bool, got {type(share).__name__}")
        arr = read_tokens(tokens, self._max_id, "prompt")
        store = TokenStore(max(1024, 2 * len(arr) + 256), False, self.config.orders)
        # The raw copy is a memcpy; the indexing is the expensive part.
        store.append_tokens(arr, False)
        store.mark_prompt_end()
        with self._lock:
            if rid in self._requests:
                raise ValueError(f"request {rid!r} already has a prompt; call finish() before reusing its id")
            self._requests[rid] = _Request(store, len(arr), len(arr), scope if share else _PRIVATE)
            self._prompts += 1
            self._prompt_tokens += len(arr)
            if share:
                self._budget.touch(scope)
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
        if req.scope is _PRIVATE:
            return
        with self._lock:
            start, end = req.shared_upto, req.store.appended
            if end <= start:
                return
            context = self.config.share_prompt_tail if start == req.prompt_len else max(self.config.orders)
            req.shared_upto = end
            # What Inserter.share appends: the separator, then the request's
            # tokens from ``start - context`` (a request store never evicts).
            count = 1 + end - max(0, start - context)
            scope, steps = self._budget.share(req.scope, count)
            # Sizing and the share are queued under the lock, so the insert
            # thread applies them in the order they were decided.
            for step in steps:
                self._apply(step)
            self._inserter.share(self._store_of(scope), req.store, start, end, context)

    def _store_of(self, scope) -> TokenStore:
        # The scope's history store, made (empty: resizes give it room) on first use.
        if scope.store is None:
            scope.store = self._histories[scope.key] = TokenStore(0, True, self.config.orders,
                                                                  self._budget.key_bits)
        return scope.store

    def _apply(self, step, now: bool = False) -> None:
        """Carry out a ``ScopeBudget`` decision on the native stores: queued
        (in order with the shares), or at once while loading (``now``)."""
        if type(step) is Drop:
            # Freed once queued inserts (and drafts) let go of it.
            del self._histories[step.scope.key]
            step.scope.store = None
            return
        if now:
            self._store_of(step.scope).resize(step.capacity)
        else:
            self._inserter.resize(self._store_of(step.scope), step.capacity)

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
        return self._drafter().draft_context(req.store, self._histories.get(req.scope), context, budget,
                                             one_branch, self._draft_config, self._max_id)

    def batch_draft(self, rids: Sequence[Hashable], contexts: Sequence[Any], budget: int,
                    one_branch: bool = False) -> list[Draft]:
        """:meth:`draft` for a batch in one call."""
        budget = check_budget(budget)
        if len(rids) != len(contexts):
            raise ValueError(f"batch_draft got {len(rids)} rids but {len(contexts)} contexts")
        stores, histories = [], []
        requests, history_of = self._requests, self._histories.get
        for rid in rids:
            req = requests.get(rid)
            if req is None:
                raise ValueError(f"unknown request {rid!r}: call put_prompt() first")
            stores.append(req.store)
            histories.append(history_of(req.scope))
        return self._drafter().draft_batch(stores, histories, list(contexts), budget, one_branch,
                                           self._draft_config, self._max_id)

    def _logged_draft(self, rid, context, budget, one_branch=False):
        draft = LookaheadCache.draft(self, rid, context, budget, one_branch)
        self._log.record(self, rid, context, draft)
        return draft

    def _logged_batch_draft(self, rids, contexts, budget, one_branch=False):
        drafts = LookaheadCache.batch_draft(self, rids, contexts, budget, one_branch)
        for rid, context, draft in zip(rids, contexts, drafts):
            self._log.record(self, rid, context, draft)
        return drafts

    # -- introspection and persistence ----------------------------------------

    def __contains__(self, rid: Hashable) -> bool:
        return rid in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def stats(self) -> dict:
        """Sizes and counters, for logs, metrics and benchmarks.

        ``scopes`` histories hold ``shared_tokens`` live tokens in
        ``shared_bytes`` (the same as ``scope_bytes``); ``shared_capacity``
        is the most one history holds."""
        with self._lock:
            live = list(self._requests.values())
            stores = [r.store for r in live]
            drafters = list(self._drafters)
            budget = self._budget
            scopes, shared_bytes, shared_tokens, seen = len(budget.scopes), budget.bytes, budget.tokens, budget.appended
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
            "scopes": scopes,
            "scope_bytes": shared_bytes,
            "shared_tokens": shared_tokens,
            "shared_tokens_seen": seen,
            "shared_capacity": self.config.shared_capacity,
            "shared_bytes": shared_bytes,
            "total_bytes": shared_bytes + local_bytes,
            "pending_inserts": self._inserter.pending(),
            "failed_inserts": self._inserter.failures,
        }

    def scope_stats(self) -> dict:
        """Per scope holding a history (least recently used first): its live
        ``tokens``, ``capacity`` and ``bytes``."""
        with self._lock:
            return self._budget.summary()

    def save(self, path: str | os.PathLike, *, background: bool = False) -> Optional[Future]:
        """Write every scope's shared history (not live requests) to ``path`` (.npz).

        The file is written under a name unique to this process and call,
        then renamed over ``path``: a reader (or another replica saving to
        the same path) never sees a partial file.  ``background=True``
        returns at once: a thread of this cache takes the snapshot and
        writes it (saves asked for meanwhile are one more save after it),
        and the returned ``Future`` gives the seconds it took.  A plain save
        waits for those first, so the last save asked for is the one kept."""
        if background:
            return self._saver.submit(os.fspath(path))
        self._saver.wait()
        self._write(os.fspath(path))
        return None

    def _snapshot(self) -> tuple[list, list]:
        self.synchronize()
        with self._lock:
            held = [(s.key, s.store) for s in self._scopes.values() if s.store is not None]
        # Each history is copied under its own lock (shares to the others go on).
        return [key for key, _ in held], [store.tokens() for _, store in held]

    def _write(self, path: str) -> None:
        keys, arrays = self._snapshot()
        meta = {"format": _FORMAT_VERSION, "config": {**asdict(self.config), "orders": list(self.config.orders)},
                "scopes": keys}
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        lengths = np.asarray([len(a) for a in arrays], dtype=np.int64)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, tokens=tokens, lengths=lengths,
                                    meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, **overrides: Any) -> "LookaheadCache":
        """A cache whose shared histories are the ones saved at ``path``
        (each scope stays isolated; a file of format 1, one shared history,
        loads as the default scope's)."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(bytes(data["meta"]).decode())
                fmt = meta.get("format")
                if fmt == 1:
                    keys, chunks = [None], [np.ascontiguousarray(data["shared"], dtype=np.int32)]
                elif fmt == _FORMAT_VERSION:
                    keys, chunks = _split_scopes(meta, data["tokens"], data["lengths"])
                else:
                    raise ValueError(f"unsupported lookahead cache format {fmt!r}")
            config = dict(meta["config"], orders=tuple(meta["config"]["orders"]))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: not a saved LookaheadCache ({type(exc).__name__}: {exc})") from None
        config.update(overrides)
        cache = cls(LookaheadConfig(**config))
        try:
            for tokens in chunks:
                if tokens.size and (tokens.min() < -1 or (cache.config.vocab_size and
                                                          tokens.max() >= cache.config.vocab_size)):
                    raise ValueError(f"{path}: saved history holds ids outside the vocabulary")
            # Least recently used first, so the budget keeps the most recent
            # scopes if it is smaller now.  Nothing else writes them yet.
            for key, tokens in zip(keys, chunks):
                if not tokens.size:
                    continue
                scope, steps = cache._budget.share(key, int(tokens.size))
                for step in steps:
                    cache._apply(step, now=True)
                cache._store_of(scope).append_indexed(tokens)
        except BaseException:
            cache.close()
            raise
        return cache

    @classmethod
    def open(cls, path: str | os.PathLike | None, **overrides: Any) -> "LookaheadCache":
        """A server's start-up: the cache saved at ``path`` if there is one,
        else an empty one.  A file that cannot be loaded (truncated, corrupt,
        saved for another vocabulary) must not keep the server down: it is
        renamed to ``PATH.corrupt``, kept for a look, and the cache starts
        empty, with a warning saying why."""
        if path is None or not os.path.exists(path):
            return cls(**overrides)
        try:
            return cls.load(path, **overrides)
        except ValueError as exc:
            aside = f"{os.fspath(path)}.corrupt"
            try:
                os.replace(path, aside)
                kept = f"moved it to {aside}"
            except OSError as move_error:  # e.g. another replica moved it first
                kept = f"could not move it aside ({move_error})"
            logger.warning("LOOKAHEAD: cannot load the saved trie: %s; %s and starting with an empty "
                           "history", exc, kept)
            return cls(**overrides)

    def close(self) -> None:
        """Finish pending saves and inserts, and stop the background thread."""
        self._saver.wait()
        self._inserter.close()
        if "draft" in self.__dict__:  # the draft log's file
            self._log.close()


def _split_scopes(meta: dict, tokens: np.ndarray, lengths: np.ndarray) -> tuple[list, list]:
    # A format-2 file's histories, checked for consistency.
    keys = meta["scopes"]
    if not isinstance(keys, list) or any(k is not None and type(k) is not str for k in keys):
        raise ValueError("the scopes are not a list of names")
    if len(set(keys)) != len(keys):
        raise ValueError("a scope is saved twice")
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or len(lengths) != len(keys) or (lengths < 0).any() or lengths.sum() != len(tokens):
        raise ValueError("the histories' lengths do not match the tokens saved")
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    ends = np.cumsum(lengths)
    return keys, [tokens[end - n: end] for n, end in zip(lengths.tolist(), ends.tolist())]


class _Saver:
    """Writes a cache's snapshots from a thread of its own, so that saving
    never holds up the caller (a server's scheduler): one save at a time,
    and any asked for meanwhile become a single save after it (of the
    newest state).  The thread exits when there is nothing to save; it is
    not a daemon, so a save in progress completes before the process exits."""

    def __init__(self, cache: LookaheadCache):
        self._cache = cache
        self._cond = threading.Condition()
        self._queued: dict[str, Future] = {}  # path -> the future of its next save
        self._running = False

    def submit(self, path: str) -> Future:
        with self._cond:
            future = self._queued.get(path)
            if future is None:
                future = self._queued[path] = Future()
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="lookahead-save", daemon=False).start()
            return future

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queued:
                    self._running = False
                    self._cond.notify_all()
                    return
                path = next(iter(self._queued))
                future = self._queued.pop(path)
            future.set_running_or_notify_cancel()
            t0 = time.monotonic()
            try:
                self._cache._write(path)
            except BaseException as exc:
                logger.warning("LOOKAHEAD: could not save the trie to %s: %s", path, exc)
                future.set_exception(exc)
            else:
                future.set_result(time.monotonic() - t0)

    def wait(self) -> None:
        """Until no save is queued or in progress."""
        with self._cond:
            while self._running:
                self._cond.wait()


class _DraftLog:
    """Appends each draft, with what it was drafted for, to a JSONL file
    (see ``DRAFT_LOG_ENV``)."""

    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def record(self, cache: LookaheadCache, rid, context, draft: Draft) -> None:
        req = cache._requests.get(rid)
        if req is None:
            return
        tail = list(context[-cache.config.max_match_len:])
        line = json.dumps({
            "rid": rid if isinstance(rid, (str, int)) else repr(rid),
            "scope": None if req.scope is _PRIVATE else req.scope,
            "share": req.scope is not _PRIVATE,
            "stream": req.store.appended,
            "context": [int(t) for t in tail],
            "tokens": list(draft.tokens),
            "parents": list(draft.parents),
        })
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
