"""One history for a fleet: LOOKAHEAD's text shared through Redis Streams
(``--speculative-lookahead-share redis://[user:password@]host:port/db``).

Every replica (a server behind a router, or one data-parallel rank of a
server: each scheduler process is a replica) publishes each request it
finishes, its prompt and output with its isolation scope, to one stream per
model (``lookahead:<served model name>:history``, capped at
``--speculative-lookahead-share-maxlen`` entries with ``XADD ... MAXLEN ~``).
A background thread reads the other replicas' entries and inserts them into
this replica's trie (``LookaheadCache.put_finished``), in the scope they
carry: a tenant's text reaches only the same tenant's scope elsewhere.  A
replica started with ``--speculative-lookahead-isolation request`` neither
publishes nor reads.  Corpora added or removed over HTTP travel the same way,
as control entries, scoped as added.

Invariants:

* Drafting never waits on the network, and nothing here can stop a
  scheduler: the scheduler only appends to a bounded queue; two daemon
  threads (publish, read) talk to Redis and catch every exception.
* The broker down, slow or restarted: the replica serves from its own
  history, logs the outage once, retries with backoff (0.2 s doubling to 5 s)
  and, on return, publishes what waited and reads on from the last entry it
  read.  While it is down at most ``QUEUE_ENTRIES`` finished requests wait;
  beyond that the oldest are dropped and counted (``dropped``).
* An entry that is not LOOKAHEAD's format 1 for this vocabulary
  (``foreign``) or that does not parse or check (``malformed``) is skipped
  and counted, never inserted.
* A new replica reads the whole capped stream at start (oldest first), so
  it drafts from the fleet's recent history from its first request.
* The URL's password never reaches a log: only ``mask_url``'s form does.

The lag from a commit on one replica to its text being available to drafts
on another (``lag_ms_p50`` / ``lag_ms_p99`` in ``stats()``) is measured from
the publisher's clock to the reader's, so across machines it includes their
clock offset.

Entry fields (bytes): ``v`` (format, ``1``), ``kind`` (``text``,
``corpus+``, ``corpus-``), ``replica`` (the publisher's random id), ``group``
(its server: data-parallel ranks of one server share it), ``vocab`` (its
vocabulary size), ``scope`` (JSON: null or the scope key), ``t`` (publish
time, Unix seconds); ``prompt`` and ``output`` (little-endian int32 ids) for
text; ``corpus`` (its id) and ``tokens`` (its token stream, int32, ``-1``
between documents) for ``corpus+``, ``corpus`` for ``corpus-``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Optional
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from lookahead.trie.config import option_error

logger = logging.getLogger(__name__)

FORMAT = b"1"
DEFAULT_MAXLEN = 10_000  # stream entries kept (about: MAXLEN ~ trims whole nodes); each holds a prompt and its output
QUEUE_ENTRIES = 4096  # finished requests that may wait for the broker; beyond, the oldest are dropped
READ_COUNT = 256  # entries per XREAD
READ_BLOCK_MS = 1000
BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0
LAGS_KEPT = 4096
SUMMARY_SECONDS = 60.0  # at most one stats line per this many seconds, when entries arrived

SCHEMES = ("redis", "rediss", "unix")
KINDS = (b"text", b"corpus+", b"corpus-")
SEPARATOR = -1  # between a corpus's documents on the stream


class ShareUnavailable(ValueError):
    """The flag is used without the ``redis`` client installed."""


def mask_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: the only form logged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def mask_in(value: Any, url: Optional[str]) -> Any:
    """``value`` (text, or a dict of server args as logged and served at
    ``/server_info``) with ``url`` in its masked form."""
    if not url or mask_url(url) == url:
        return value
    if isinstance(value, str):
        return value.replace(url, mask_url(url))
    if isinstance(value, dict):
        return {k: mask_in(v, url) for k, v in value.items()}
    return value


def check_url(value: Any, name: str = "") -> str:
    """A Redis URL: ``redis://[user:password@]host[:port][/db]`` (``rediss://``
    for TLS, ``unix:///path.sock``); a ``ValueError`` naming ``name``
    otherwise (the message shows the URL masked)."""
    if not isinstance(value, str) or not value.strip():
        raise option_error(name, f"must be a Redis URL such as redis://host:6379/0, got {value!r}")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise option_error(name, f"must be a Redis URL ({exc}), got {mask_url(value)}") from None
    if parts.scheme not in SCHEMES:
        raise option_error(name, f"must start with redis://, rediss:// or unix://, got {mask_url(value)}")
    if parts.scheme == "unix":
        if not parts.path:
            raise option_error(name, f"needs the socket's path in a unix:// URL, got {mask_url(value)}")
        return value
    if not parts.hostname:
        raise option_error(name, f"needs a host (redis://host:6379/0), got {mask_url(value)}")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise option_error(name, f"needs a database number after the host (redis://host:6379/0), got "
                                 f"{mask_url(value)}")
    return value


def check_maxlen(value: Any, name: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise option_error(name, f"must be an integer >= 1 (stream entries kept), got {value!r}")
    return value


def check_options(url: Optional[str], maxlen: int) -> None:
    """The two flags' values (the server args' checks)."""
    if url is not None:
        check_url(url, "--speculative-lookahead-share")
    check_maxlen(maxlen, "--speculative-lookahead-share-maxlen")


def require_client():
    """The ``redis`` module, or a ``ShareUnavailable`` that says how to install it."""
    try:
        import redis
    except ImportError:
        raise ShareUnavailable(
            "--speculative-lookahead-share needs the Redis client: pip install 'sglang-lookahead[share]' "
            "(or pip install redis)") from None
    return redis


def stream_name(model: str) -> str:
    return f"lookahead:{model}:history"


def _ids(data: bytes, what: str) -> np.ndarray:
    if len(data) % 4:
        raise ValueError(f"{what}: {len(data)} bytes is not a whole number of int32 ids")
    return np.frombuffer(data, dtype="<i4").astype(np.int32)


class Foreign(Exception):
    """Not an entry of this format and vocabulary."""


def parse_entry(fields: dict, vocab: Optional[int]) -> dict:
    """An entry's fields, checked: ``Foreign`` if it is not LOOKAHEAD's
    format for this vocabulary, ``ValueError`` if it does not parse."""
    if fields.get(b"v") != FORMAT:
        raise Foreign(f"format {fields.get(b'v')!r}")
    kind = fields.get(b"kind")
    if kind not in KINDS:
        raise Foreign(f"kind {kind!r}")
    if vocab is not None and fields.get(b"vocab") != str(vocab).encode():
        raise Foreign(f"vocabulary {fields.get(b'vocab')!r}, this model's is {vocab}")
    replica = fields.get(b"replica")
    if not replica:
        raise ValueError("no replica id")
    scope = json.loads(fields[b"scope"].decode()) if b"scope" in fields else None
    if scope is not None and type(scope) is not str:
        raise ValueError(f"scope must be null or a string, got {scope!r}")
    entry = {"kind": kind, "replica": replica, "group": fields.get(b"group", b""), "scope": scope,
             "t": float(fields[b"t"])}
    if kind == b"text":
        entry["prompt"] = _ids(fields[b"prompt"], "prompt")
        entry["output"] = _ids(fields[b"output"], "output")
    else:
        corpus = fields[b"corpus"].decode()
        if not corpus:
            raise ValueError("empty corpus id")
        entry["corpus"] = corpus
        if kind == b"corpus+":
            entry["tokens"] = _ids(fields[b"tokens"], "tokens")
    return entry


def _as_bytes(ids) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


class FleetShare:
    """This replica's side of the fleet's history: ``publish_*`` from the
    scheduler (never blocks, never raises), two threads for Redis.

    ``cache``: the replica's ``LookaheadCache``; ``model``: the stream's
    model name (every replica of the fleet must give the same one);
    ``vocab``: the vocabulary size (entries for another are foreign);
    ``group``: this server's id (control entries of the same group are
    skipped: the server already gave the corpus to each of its ranks);
    ``read``: whether to read the others' entries (False: publish only)."""

    def __init__(self, url: str, model: str, cache, *, maxlen: int = DEFAULT_MAXLEN, vocab: Optional[int] = None,
                 group: str = "", read: bool = True, queue_entries: int = QUEUE_ENTRIES,
                 client_factory: Optional[Callable[[], Any]] = None, metrics_labels: Optional[dict] = None):
        check_url(url, "--speculative-lookahead-share")
        self.url = url
        self.masked = mask_url(url)
        self.stream = stream_name(model)
        self.cache = cache
        self.maxlen = check_maxlen(maxlen, "--speculative-lookahead-share-maxlen")
        self.vocab = vocab
        self.replica = secrets.token_hex(8).encode()
        self.group = group.encode()
        self.read = read
        if client_factory is None:
            redis = require_client()

            def client_factory():
                # socket_timeout above the blocking read's, so a slow broker is an error, not a hang.
                return redis.Redis.from_url(url, socket_timeout=READ_BLOCK_MS / 1000 + 4, socket_connect_timeout=2)
        self._client_factory = client_factory
        self._queue: collections.deque = collections.deque()
        self._queue_entries = queue_entries
        self._wake = threading.Condition()
        self._closed = threading.Event()
        self._state_lock = threading.Lock()
        self._down = False
        self._lags: collections.deque = collections.deque(maxlen=LAGS_KEPT)
        self.counts = collections.Counter()
        self._last_summary = time.monotonic()
        self._threads = []
        self._metrics = None if metrics_labels is None else ShareMetrics({**metrics_labels,
                                                                          "replica": self.replica.decode()})

    # -- the scheduler's side: never blocks on the network, never raises ------

    def publish_text(self, prompt, output, scope: Optional[str]) -> None:
        """A request finished here: its prompt and output, for the fleet."""
        self._enqueue((b"text", prompt, output, scope, time.time()))

    def publish_corpus_add(self, corpus_id: str, token_chunks, scope: Optional[str]) -> None:
        self._enqueue((b"corpus+", corpus_id, token_chunks, scope, time.time()))

    def publish_corpus_remove(self, corpus_id: str) -> None:
        self._enqueue((b"corpus-", corpus_id, None, None, time.time()))

    def _enqueue(self, item) -> None:
        try:
            with self._wake:
                if len(self._queue) >= self._queue_entries:
                    self._queue.popleft()
                    self.counts["dropped"] += 1
                self._queue.append(item)
                self._wake.notify()
        except Exception:  # never the scheduler's problem
            self.counts["errors"] += 1

    # -- threads -----------------------------------------------------------------

    def start(self) -> "FleetShare":
        targets = [("lookahead-share-publish", self._publish_loop)]
        if self.read:
            targets.append(("lookahead-share-read", self._read_loop))
        for name, target in targets:
            thread = threading.Thread(target=self._guard, args=(target,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("LOOKAHEAD share: stream %s on %s (cap ~%d entries), replica %s%s", self.stream, self.masked,
                    self.maxlen, self.replica.decode(), "" if self.read else ", publishing only")
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._closed.set()
        with self._wake:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def _guard(self, loop) -> None:
        # The last line of defence: a bug here ends sharing, never the scheduler.
        try:
            loop()
        except BaseException:
            logger.exception("LOOKAHEAD share: %s stopped; this replica serves from its own history",
                             threading.current_thread().name)

    def _outage(self, exc: BaseException) -> None:
        with self._state_lock:
            first = not self._down
            self._down = True
            if first:
                self.counts["outages"] += 1
        if first:
            # str(exc) of the client names host and port, never the password.
            logger.warning("LOOKAHEAD share: cannot reach %s (%s: %s); serving from this replica's own history, "
                           "retrying with backoff", self.masked, type(exc).__name__, exc)

    def _reachable(self) -> None:
        with self._state_lock:
            was_down, self._down = self._down, False
        if was_down:
            logger.info("LOOKAHEAD share: %s reachable again; catching up", self.masked)

    def _backoff(self, delay: float) -> float:
        self._closed.wait(delay)
        return min(delay * 2, BACKOFF_MAX)

    def _publish_loop(self) -> None:
        client, delay = None, BACKOFF_FIRST
        while not self._closed.is_set():
            with self._wake:
                while not self._queue and not self._closed.is_set():
                    self._wake.wait(1.0)
                batch = [self._queue.popleft() for _ in range(min(64, len(self._queue)))]
            if not batch:
                continue
            try:
                if client is None:
                    client = self._client_factory()
                pipe = client.pipeline(transaction=False)
                for item in batch:
                    pipe.xadd(self.stream, self._fields(item), maxlen=self.maxlen, approximate=True)
                pipe.execute()
                self.counts["published"] += sum(1 for item in batch if item[0] == b"text")
                self._export()
                self._reachable()
                delay = BACKOFF_FIRST
            except Exception as exc:
                client = self._drop_client(client)
                with self._wake:  # back to the front, in order, within the bound
                    self._queue.extendleft(reversed(batch))
                    while len(self._queue) > self._queue_entries:
                        self._queue.popleft()
                        self.counts["dropped"] += 1
                self._outage(exc)
                delay = self._backoff(delay)

    def _fields(self, item) -> dict:
        kind, a, b, scope, t = item
        fields = {b"v": FORMAT, b"kind": kind, b"replica": self.replica, b"group": self.group,
                  b"vocab": str(self.vocab).encode(), b"scope": json.dumps(scope).encode(), b"t": repr(t).encode()}
        if kind == b"text":
            fields[b"prompt"], fields[b"output"] = _as_bytes(a), _as_bytes(b)
        else:
            fields[b"corpus"] = a.encode()
            if kind == b"corpus+":
                # Consecutive pieces of one token stream; any document boundary (-1 or -2**31) travels as -1.
                ids = np.concatenate([np.asarray(c, dtype=np.int64) for c in b]) if b else np.zeros(0, np.int64)
                fields[b"tokens"] = _as_bytes(np.where(ids < 0, SEPARATOR, ids))
        return fields

    @staticmethod
    def _drop_client(client) -> None:
        try:
            if client is not None:
                client.close()
        except Exception:
            pass
        return None

    def _read_loop(self) -> None:
        # "0-0": the first read starts at the oldest entry kept (the warm start).
        client, delay, last = None, BACKOFF_FIRST, b"0-0"
        while not self._closed.is_set():
            try:
                if client is None:
                    client = self._client_factory()
                got = client.xread({self.stream: last}, count=READ_COUNT, block=READ_BLOCK_MS)
                self._reachable()
                delay = BACKOFF_FIRST
            except Exception as exc:
                client = self._drop_client(client)
                self._outage(exc)
                delay = self._backoff(delay)
                continue
            entries = got[0][1] if got else []
            if entries:
                last = entries[-1][0]
                self._apply(entries)
                self._export()
            self._summary()

    def _apply(self, entries) -> None:
        texts = []
        for entry_id, fields in entries:
            try:
                entry = parse_entry(fields, self.vocab)
            except Foreign:
                self.counts["foreign"] += 1
                continue
            except Exception:
                self.counts["malformed"] += 1
                continue
            if entry["replica"] == self.replica:
                continue  # this replica's own
            try:
                if entry["kind"] == b"text":
                    self.cache.put_finished(entry["prompt"], entry["output"], scope=entry["scope"])
                    texts.append(entry["t"])
                elif entry["group"] and entry["group"] == self.group:
                    continue  # this server gave the corpus to every rank already
                elif entry["kind"] == b"corpus+":
                    self._add_corpus(entry)
                else:
                    self._remove_corpus(entry)
            except (ValueError, TypeError):
                self.counts["malformed"] += 1
            except Exception:
                self.counts["errors"] += 1
                logger.exception("LOOKAHEAD share: could not insert entry %s", entry_id)
        if texts:
            self.cache.synchronize()  # available to drafts from here
            now = time.time()
            self._lags.extend(max(0.0, now - t) for t in texts)
            self.counts["received"] += len(texts)

    def _add_corpus(self, entry) -> None:
        from lookahead.trie.corpora import CorpusError

        tokens = entry["tokens"]
        if tokens.size and (tokens.min() < SEPARATOR or (self.vocab and tokens.max() >= self.vocab)):
            raise ValueError("corpus ids outside the vocabulary")
        try:
            self.cache.add_corpus(entry["corpus"], [tokens], entry["scope"], background=True)
            self.counts["corpora_added"] += 1
        except CorpusError as exc:  # e.g. it exists here already: the fleet's copy is the same text
            self.counts["corpora_skipped"] += 1
            logger.info("LOOKAHEAD share: corpus %s from the fleet not added: %s", entry["corpus"], exc)

    def _remove_corpus(self, entry) -> None:
        from lookahead.trie.corpora import CorpusError

        try:
            self.cache.remove_corpus(entry["corpus"])
            self.counts["corpora_removed"] += 1
        except CorpusError:
            pass  # not here (never added, or removed already)

    def _summary(self) -> None:
        if time.monotonic() - self._last_summary < SUMMARY_SECONDS or not self.counts["received"]:
            return
        self._last_summary = time.monotonic()
        s = self.stats()
        logger.info("LOOKAHEAD share: received %d, published %d, lag p50 %.1f ms p99 %.1f ms, dropped %d, "
                    "malformed %d, foreign %d", s["received"], s["published"], s["lag_ms_p50"], s["lag_ms_p99"],
                    s["dropped"], s["malformed"], s["foreign"])

    def _export(self) -> None:
        if self._metrics is not None:
            try:
                self._metrics.update(self.stats())
            except Exception:  # metrics are no reason to stop sharing
                self.counts["errors"] += 1

    def stats_entry(self) -> dict:
        """The worker's ``lookahead_stats`` entry."""
        return {"share": self.stats()}

    def stats(self) -> dict:
        lags = np.asarray(self._lags, dtype=np.float64) * 1e3
        keys = ("published", "received", "dropped", "malformed", "foreign", "outages", "errors",
                "corpora_added", "corpora_skipped", "corpora_removed")
        return {**{k: self.counts[k] for k in keys}, "queued": len(self._queue), "down": self._down,
                "lag_ms_p50": float(np.percentile(lags, 50)) if lags.size else float("nan"),
                "lag_ms_p99": float(np.percentile(lags, 99)) if lags.size else float("nan")}


def server_group(server_args) -> str:
    """What the data-parallel ranks of one server share: the host, the
    launching process and the HTTP port."""
    return f"{socket.gethostname()}:{os.getppid()}:{getattr(server_args, 'port', '')}"


class ShareMetrics:
    """Prometheus gauges (``--enable-metrics``): the entries by what became
    of them, and the commit-to-draft lag's p50 and p99."""

    COUNTS = ("published", "received", "dropped", "malformed", "foreign", "outages")

    def __init__(self, labels: dict):
        from prometheus_client import Gauge  # after SGLang set PROMETHEUS_MULTIPROC_DIR

        names = list(labels)
        entries = Gauge("sglang:lookahead_share_entries",
                        "LOOKAHEAD --speculative-lookahead-share: finished requests published, received "
                        "(inserted here), dropped (the publish queue overflowed while Redis was down), "
                        "malformed or foreign (skipped); outages: times Redis became unreachable.",
                        names + ["what"], multiprocess_mode="mostrecent")
        lag = Gauge("sglang:lookahead_share_lag_ms",
                    "LOOKAHEAD --speculative-lookahead-share: milliseconds from a request's commit on "
                    "another replica to its text being available to drafts here (recent entries).",
                    names + ["quantile"], multiprocess_mode="mostrecent")
        self._entries = {what: entries.labels(**labels, what=what) for what in self.COUNTS}
        self._lag = {q: lag.labels(**labels, quantile=q) for q in ("0.5", "0.99")}

    def update(self, stats: dict) -> None:
        for what, gauge in self._entries.items():
            gauge.set(stats[what])
        if stats["received"]:
            self._lag["0.5"].set(stats["lag_ms_p50"])
            self._lag["0.99"].set(stats["lag_ms_p99"])


class NoShare:
    """A replica that shares nothing: what the worker holds without the flag."""

    def publish_text(self, prompt, output, scope) -> None:
        pass

    def publish_corpus_add(self, corpus_id, token_chunks, scope) -> None:
        pass

    def publish_corpus_remove(self, corpus_id) -> None:
        pass

    def stats_entry(self) -> dict:
        return {}

    def close(self, timeout: float = 0.0) -> None:
        pass


def start_for_worker(worker, server_args):
    """``--speculative-lookahead-share``: this scheduler's ``FleetShare``,
    started and fed from its requests (``worker.feed``); else a ``NoShare``.
    With ``--speculative-lookahead-isolation request`` nothing is shared."""
    args = worker.args
    if not args.share:
        return NoShare()
    if args.isolation == "request":
        logger.info("LOOKAHEAD share: --speculative-lookahead-isolation request shares no text; not sharing "
                    "through %s", mask_url(args.share))
        return NoShare()
    model = getattr(server_args, "served_model_name", None) or server_args.model_path
    labels = {"model_name": model} if getattr(server_args, "enable_metrics", False) else None
    share = FleetShare(args.share, model, worker.cache, maxlen=args.share_maxlen,
                       vocab=worker.cache.config.vocab_size, group=server_group(server_args), metrics_labels=labels)
    worker.feed.on_text = share.publish_text
    return share.start()


def check_server_args(server_args, share: Optional[str]) -> None:
    """Start-up checks of ``--speculative-lookahead-share`` on the resolved record."""
    if not share:
        return
    require_client()
    tp = getattr(server_args, "tp_size", 1) or 1
    if tp > 1:
        # Every rank of a tensor-parallel group must draft the same trees;
        # text arriving from the fleet reaches each rank at its own time.
        raise ValueError("--speculative-lookahead-share does not support tensor parallelism (--tp-size > 1); "
                         "use it with --dp-size or several servers behind a router")
