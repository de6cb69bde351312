"""``LookaheadCache``: the drafting API that the SGLang worker and users drive.

It owns one shared history per scope (the cross-request n-gram source: the
outputs of the scope's requests; see ``lookahead.trie.scopes`` for how they share
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
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any, Hashable, NamedTuple, Optional, Sequence

import numpy as np

from lookahead.trie._drafting import Drafter
from lookahead.trie._inserter import Inserter
from lookahead.trie._store import TokenStore
from lookahead.trie._tokens import read_tokens
from lookahead.trie._tuning import TUNING_FIELDS, DraftTuning
from lookahead.trie.answers import AnswerMemo, fingerprint, follow
from lookahead.trie.config import LookaheadConfig, check_number
from lookahead.trie.corpora import CorpusOverBudget, CorpusSet
from lookahead.trie.draft_log import DRAFT_LOG_ENV, DraftLog
from lookahead.trie.requests import Request, finished_elsewhere, share_tail
from lookahead.trie.saving import FORMAT_VERSION, Saver, split_corpora, split_scopes
from lookahead.trie.scopes import PRIVATE, Drop, ScopeBudget, check_scope
from lookahead.trie.tokens import MAX_TOKEN_ID, check_budget

logger = logging.getLogger(__name__)

# How often a token of an answer given before to the same prompt is accepted,
# given the previous one: what a draft that follows it expects (Draft.expected).
ANSWER_ODDS = 0.9

# A request drafts from at most this many live requests of the same prompt in
# its scope (its group: the samples of one RL prompt, n > 1), the latest first.
GROUP_PEERS = 3



class Draft(NamedTuple):
    """A draft tree in topological order.

    ``parents[i] == -1``: token ``i`` follows the context's last token;
    otherwise it follows token ``parents[i]`` (always an earlier index).  A
    one-branch draft is a chain: ``parents == [-1, 0, 1, ...]``.
    ``expected``: the tokens the target is expected to accept from it, the
    sum over its nodes of the trie's estimate that the path to the node is
    accepted (what the worker weighs a draft's cost against); ``scores``:
    those estimates node by node, best first, so ``tokens[:k]`` (with
    ``parents[:k]``) is the best draft of ``k`` tokens.
    """

    tokens: list
    parents: list
    expected: float = 0.0
    scores: list = ()

    def __len__(self) -> int:  # number of draft tokens
        return len(self.tokens)


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

    def __init__(self, config: LookaheadConfig | None = None, *, tuning: DraftTuning | None = None,
                 **overrides: Any):
        """``config``, or ``LookaheadConfig(**overrides)``, or ``config`` with
        ``overrides`` replacing some of its fields.  ``tuning``: how drafts
        rank what they find (``lookahead.trie._tuning``; the tuned defaults when
        None), for experiments."""
        if config is None:
            config = LookaheadConfig(**overrides)
        elif overrides:
            config = LookaheadConfig(**{**asdict(config), **overrides})
        if tuning is not None and not isinstance(tuning, DraftTuning):
            raise TypeError(f"tuning must be a lookahead.trie._tuning.DraftTuning, got {type(tuning).__name__}")
        self.config = config
        self._tuning = DraftTuning() if tuning is None else tuning
        self._draft_config = self._tuning.native(config.max_match_len)
        self._max_id = MAX_TOKEN_ID if config.vocab_size is None else config.vocab_size - 1
        self._budget = ScopeBudget(config.max_memory_bytes, config.shared_capacity, len(config.orders))
        self._scopes = self._budget.scopes  # key -> Scope
        # key -> its history's store, for drafts (read without the lock: a
        # dict lookup per request and step; a dropped store lives on while
        # a draft holds it).  Kept in step with the budget's scopes.
        self._histories: dict[Any, TokenStore] = {}
        self._requests: dict[Hashable, Request] = {}
        self._groups: dict[tuple, list] = {}  # (scope, prompt fingerprint) -> live rids, in arrival order
        self._lock = threading.Lock()
        self._inserter = Inserter(config.background)
        self._scratch = threading.local()
        self._drafters: list[Drafter] = []
        self._prompts = self._prompt_tokens = self._output_tokens = self._finished = 0
        self._saver = Saver(self)
        self._corpora = CorpusSet(config.corpus_memory_bytes, config.orders, self._max_id)
        self._answers = AnswerMemo(config.remember_answers)
        log = os.environ.get(DRAFT_LOG_ENV)
        if log:
            self._log = DraftLog(log)
            self.draft = self._logged_draft
            self.batch_draft = self._logged_batch_draft

    @property
    def min_score(self) -> float:
        """Draft nodes whose estimated acceptance is below this are left out
        (0: drafts fill their budget).  The server's worker sets it from the
        measured cost of verifying a token (``lookahead.plugin.verify_cost``)."""
        return self._draft_config.min_score

    @min_score.setter
    def min_score(self, value: float) -> None:
        self._draft_config.min_score = check_number(value, 0, "min_score", finite=True)

    # -- feeding -------------------------------------------------------------

    def put_prompt(self, rid: Hashable, tokens: Any, *, scope: Optional[str] = None, share: bool = True,
                   corpora: Optional[Sequence[str]] = None) -> None:
        """Index a new request's whole prompt (in the background).

        The request drafts from its own prompt and output and from its
        ``scope``'s shared history (a ``str``, or ``None`` for the default
        scope), and its output enters that history only.  ``share=False``:
        it neither drafts from nor feeds any shared history.  It also drafts
        from the public corpora and those bound to its scope (with
        ``share=False``: the public ones); ``corpora`` (corpus ids) restricts
        that to the ones named (an id it may not see, or that does not
        exist, is ignored)."""
        scope = check_scope(scope)
        if type(share) is not bool:
            raise TypeError(f"share must be a bool, got {type(share).__name__}")
        if corpora is not None:
            if isinstance(corpora, str):
                corpora = (corpora,)
            corpora = frozenset(corpora)
            if any(type(c) is not str for c in corpora):
                raise TypeError(f"corpora must be corpus ids (str), got {sorted(map(repr, corpora))}")
        arr = read_tokens(tokens, self._max_id, "prompt")
        store = TokenStore(max(1024, 2 * len(arr) + 256), False, self.config.orders)
        # The raw copy is a memcpy; the indexing is the expensive part.
        store.append_tokens(arr, False)
        store.mark_prompt_end()
        grouped = share and self.config.share_outputs and len(arr) > 0
        remembers = grouped and self._answers.entries > 0
        print_ = fingerprint(arr) if grouped else 0
        with self._lock:
            if rid in self._requests:
                raise ValueError(f"request {rid!r} already has a prompt; call finish() before reusing its id")
            group = None
            if grouped:
                # The samples of one prompt in flight together draft from each
                # other's output as it is written, not only once it is shared.
                group = self._groups.setdefault((scope, print_), [])
                group.append(rid)
            self._requests[rid] = Request(store, len(arr), len(arr), scope if share else PRIVATE, corpora,
                                           tail=share_tail(arr, self.config) if share else 0, print_=print_,
                                           answer=self._answers.recall(scope, print_) if remembers else None,
                                           group=group)
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
            if req.group is not None:
                req.group.remove(rid)
                if not req.group:
                    del self._groups[(req.scope, req.print_)]
            # Output tokens are counted from the store itself (no per-step bookkeeping).
            self._output_tokens += req.store.appended - req.prompt_len
        if self.config.share_outputs:
            self._share(req)

    def put_finished(self, prompt: Any, output: Any, *, scope: Optional[str] = None) -> None:
        """A request finished elsewhere (another replica of a fleet) enters
        ``scope``'s history as :meth:`finish` shares one served here (the
        output after the prompt's tail; the answer to its prompt), in the
        background.  The prompt is not indexed: no request drafts from it."""
        scope = check_scope(scope)
        p = read_tokens(prompt, self._max_id, "prompt")
        out = read_tokens(output, self._max_id, "output")
        if not self.config.share_outputs or len(out) == 0:
            return
        req = finished_elsewhere(p, out, scope, self.config, remembers=self._answers.entries > 0)
        with self._lock:
            self._budget.touch(scope)
        self._share(req)

    def _share(self, req: Request) -> None:
        # A separator keeps n-grams from spanning requests; the tokens just
        # before the new output (the prompt's tail, or the last shared output)
        # give its first tokens their context.
        if req.scope is PRIVATE:
            return
        with self._lock:
            start, end = req.shared_upto, req.store.appended
            if end <= start:
                return
            context = req.tail if start == req.prompt_len else max(self.config.orders)
            if start == req.prompt_len and req.print_:
                self._answers.remember(req.scope, req.print_, req.store.slice(start - 1, start + self._answers.keep))
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

    def clear_history(self) -> int:
        """Forget every scope's shared history and the answers remembered,
        as at start (live requests keep their own text, the external corpora
        stay); returns the shared tokens dropped.  For a new dataset or
        training run whose earlier text should no longer be drafted."""
        with self._lock:
            dropped = self._budget.tokens
            for scope in list(self._budget.scopes.values()):
                self._apply(self._budget.drop(scope))
            self._answers.clear()
        return dropped

    def synchronize(self) -> None:
        """Wait until every insert submitted so far is visible to drafts."""
        self._inserter.synchronize()

    # -- external corpora ------------------------------------------------------

    def add_corpus(self, corpus_id: str, token_chunks: Any, scope: Optional[str] = None, *,
                   background: bool = False, on_done=None, publish: bool = True):
        """Add an external corpus (``lookahead.trie.corpora``): requests draft
        from it as from their scope's history, and traffic never evicts it.

        ``token_chunks``: consecutive pieces of one token stream, as SGLang's
        NGRAM takes them (lists or arrays of ids; a document boundary is
        ``-2**31`` or ``-1``).  ``scope``: None, every request may draft
        from it; a scope key (``"cache_salt:X"``), only that scope's requests.
        Returns the tokens loaded (separators included); ``background=True``
        returns at once with a ``Future`` of that count, and drafts read
        what is indexed so far meanwhile (``on_done(future)`` is called on
        the loading thread when it ends).  Raises ``lookahead.trie.corpora.CorpusError``
        (a ``ValueError``) for an id that exists (remove it first), ids
        outside the vocabulary, or a corpus beyond ``corpus_memory_bytes``
        (nothing is truncated); a removal during the load makes it raise
        ``CorpusRemoved``.  An empty corpus is added, with 0 tokens.
        ``publish=False``: drafts do not read it until :meth:`publish_corpus`
        (tensor parallelism: every rank publishes it at the same step, once
        every rank has loaded it, so that all draft the same trees)."""
        if scope is not None:
            scope = check_scope(scope)
        return self._corpora.add(corpus_id, token_chunks, scope, background=background, on_done=on_done,
                                 publish=publish)

    def publish_corpus(self, corpus_id: str) -> None:
        """Let drafts read a corpus added with ``publish=False``."""
        self._corpora.publish(corpus_id)

    def remove_corpus(self, corpus_id: str) -> None:
        """Remove a corpus, loaded or loading (the load stops); drafts stop
        reading it at once.  ``CorpusError`` (a ``ValueError``) if there is none."""
        self._corpora.remove(corpus_id)

    def corpora(self) -> dict:
        """Every corpus by id: its ``tokens``, ``bytes`` (its share of the
        corpus budget), ``scope`` (None: public), ``state`` (``loading``,
        ``ready``) and the tokens ``loaded`` so far."""
        return self._corpora.list()

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
        draft = self._drafter().draft_context(req.store, self._shared_of(req, rid), context, budget,
                                              one_branch, self._draft_config, self._max_id)
        return draft if req.answer is None else self._follow_answer(req, context, budget, draft)

    def _follow_answer(self, req: Request, context: Any, budget: int, draft: Draft) -> Draft:
        # The request's prompt got this answer before (lookahead.trie.answers):
        # draft it while the output follows it; past that, forget it.
        tokens = follow(req.answer, context, req.store.appended - req.prompt_len, budget)
        if tokens is None:
            req.answer = None
        if not tokens:
            return draft
        # Expected: what an answer given before is worth, each token accepted
        # with ANSWER_ODDS given the previous one.
        scores = [ANSWER_ODDS ** (i + 1) for i in range(len(tokens))]
        return Draft(tokens, list(range(-1, len(tokens) - 1)), sum(scores), scores)

    def _shared_of(self, req: Request, rid: Hashable = None):
        # What the request drafts from besides its own store: its history,
        # the stores of its group's latest other live requests, and its
        # corpora if any exist.
        history = self._histories.get(req.scope)
        peers = ()
        group = req.group
        if group is not None and len(group) > 1:
            live = (self._requests.get(r) for r in group[::-1][:GROUP_PEERS + 1] if r != rid)
            peers = tuple(p.store for p in live if p is not None)[:GROUP_PEERS]
        corpora = self._corpora
        if not corpora.view:
            return (history,) + peers if peers else history
        if req.view_gen != corpora.generation:
            gen = corpora.generation
            req.view = corpora.stores_for(req.scope, req.corpora)
            req.view_gen = gen
        return (history,) + peers + req.view if (req.view or peers) else history

    def batch_draft(self, rids: Sequence[Hashable], contexts: Sequence[Any], budget: int,
                    one_branch: bool = False) -> list[Draft]:
        """:meth:`draft` for a batch in one call."""
        budget = check_budget(budget)
        if len(rids) != len(contexts):
            raise ValueError(f"batch_draft got {len(rids)} rids but {len(contexts)} contexts")
        stores, histories, following = [], [], []
        requests, history_of = self._requests, self._histories.get
        with_corpora = bool(self._corpora.view)
        for rid in rids:
            req = requests.get(rid)
            if req is None:
                raise ValueError(f"unknown request {rid!r}: call put_prompt() first")
            stores.append(req.store)
            grouped = req.group is not None and len(req.group) > 1
            histories.append(self._shared_of(req, rid) if with_corpora or grouped else history_of(req.scope))
            if req.answer is not None:
                following.append((len(stores) - 1, req))
        drafts = self._drafter().draft_batch(stores, histories, list(contexts), budget, one_branch,
                                             self._draft_config, self._max_id)
        for i, req in following:
            drafts[i] = self._follow_answer(req, contexts[i], budget, drafts[i])
        return drafts

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
        corpora = self._corpora.stats()
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
            "total_bytes": shared_bytes + local_bytes + corpora["corpus_bytes"],
            **corpora,
            "answers_remembered": len(self._answers),
            "answers_followed": self._answers.hits,
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
        corpora = self._corpora.ready()
        meta = {"format": FORMAT_VERSION, "config": {**asdict(self.config), "orders": list(self.config.orders)},
                "tuning": asdict(self._tuning), "scopes": keys,
                "corpora": [{"id": cid, "scope": scope} for cid, scope, _ in corpora]}
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        lengths = np.asarray([len(a) for a in arrays], dtype=np.int64)
        corpus_tokens = np.concatenate([c for _, _, c in corpora]) if corpora else np.zeros(0, np.int32)
        corpus_lengths = np.asarray([len(c) for _, _, c in corpora], dtype=np.int64)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, tokens=tokens, lengths=lengths, corpus_tokens=corpus_tokens,
                                    corpus_lengths=corpus_lengths,
                                    meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, *, tuning: DraftTuning | None = None,
             **overrides: Any) -> "LookaheadCache":
        """A cache whose shared histories are the ones saved at ``path``
        (each scope stays isolated; a file of format 1, one shared history,
        loads as the default scope's), with the options and tuning it was
        saved with, but for ``overrides`` and ``tuning``."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(bytes(data["meta"]).decode())
                fmt = meta.get("format")
                corpora = split_corpora(meta, data) if fmt == FORMAT_VERSION else []
                if fmt == 1:
                    keys, chunks = [None], [np.ascontiguousarray(data["shared"], dtype=np.int32)]
                elif fmt == FORMAT_VERSION:
                    keys, chunks = split_scopes(meta, data["tokens"], data["lengths"])
                else:
                    raise ValueError(f"unsupported lookahead cache format {fmt!r}")
            config = dict(meta["config"], orders=tuple(meta["config"]["orders"]))
            # Older files keep the tuning among the options.
            saved_tuning = {name: config.pop(name) for name in list(config) if name in TUNING_FIELDS}
            saved_tuning.update(meta.get("tuning", {}))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: not a saved LookaheadCache ({type(exc).__name__}: {exc})") from None
        config.update(overrides)
        cache = cls(LookaheadConfig(**config), tuning=DraftTuning(**saved_tuning) if tuning is None else tuning)
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
            for (corpus_id, scope), tokens in corpora:
                try:
                    cache.add_corpus(corpus_id, tokens, scope)
                except CorpusOverBudget as exc:  # a smaller budget now: the file is fine
                    logger.warning("LOOKAHEAD: not loading a saved corpus: %s", exc)
        except BaseException:
            cache.close()
            raise
        return cache

    @classmethod
    def open(cls, path: str | os.PathLike | None, *, tuning: DraftTuning | None = None,
             **overrides: Any) -> "LookaheadCache":
        """A server's start-up: the cache saved at ``path`` if there is one,
        else an empty one.  A file that cannot be loaded (truncated, corrupt,
        saved for another vocabulary) must not keep the server down: it is
        renamed to ``PATH.corrupt``, kept for a look, and the cache starts
        empty, with a warning saying why."""
        if path is None or not os.path.exists(path):
            return cls(tuning=tuning, **overrides)
        try:
            return cls.load(path, tuning=tuning, **overrides)
        except ValueError as exc:
            aside = f"{os.fspath(path)}.corrupt"
            try:
                os.replace(path, aside)
                kept = f"moved it to {aside}"
            except OSError as move_error:  # e.g. another replica moved it first
                kept = f"could not move it aside ({move_error})"
            logger.warning("LOOKAHEAD: cannot load the saved trie: %s; %s and starting with an empty "
                           "history", exc, kept)
            return cls(tuning=tuning, **overrides)

    def close(self) -> None:
        """Finish pending saves and inserts, and stop the background thread."""
        self._saver.wait()
        self._inserter.close()
        if "draft" in self.__dict__:  # the draft log's file
            self._log.close()
