"""SGLang's external-corpus endpoints on a LOOKAHEAD server.

SGLang 0.5.23 serves ``POST /add_external_corpus``, ``POST
/remove_external_corpus`` and ``GET /list_external_corpora`` for NGRAM only:
the tokenizer manager answers "Ngram speculative decoding is not enabled"
unless the algorithm is NGRAM, and the scheduler builds its
``ExternalCorpusManager`` only for ``is_ngram()``.  The hooks here give
LOOKAHEAD the same endpoints with the same bodies, status codes and admin
authorization (the routes are SGLang's own, ``--admin-api-key`` included):

In the HTTP server's process (``install_tokenizer_side``, from LOOKAHEAD's
``handle_server_args``, which runs in the launching process of a LOOKAHEAD
server only):

* ``TokenizerManager.__init__`` (AROUND): on a LOOKAHEAD server, the add
  request type gets an optional ``scope`` field (``"cache_salt:X"``: only
  that scope's requests draft from the corpus), as a registered subclass of
  SGLang's ``AddExternalCorpusReqInput``, which the route builds from the body;
* ``TokenizerControlMixin.add_external_corpus`` / ``remove_external_corpus``
  / ``list_external_corpora`` (AROUND): for LOOKAHEAD, documents and files
  are tokenized off the event loop (``file_path`` may be any corpus
  ``lookahead.trie.corpora.iter_documents`` reads: SGLang's JSONL of strings, a
  ``.jsonl`` of ``{"text"}`` / ``{"input_ids"}``, a directory, a text file),
  then sent to every scheduler (every DP replica) as NGRAM's are.

* a middleware on SGLang's app answers a body of ``/add_external_corpus``
  or ``/remove_external_corpus`` that is not a JSON object with HTTP 400
  and a message, as a bad field is answered (SGLang's routes parse it
  unguarded, so a body such as ``{not json`` was an HTTP 500).

In the scheduler (``install_scheduler_side``, from the worker's constructor):

* ``Scheduler.add_external_corpus`` / ``remove_external_corpus`` /
  ``list_external_corpora`` (AROUND): a LOOKAHEAD scheduler gets a corpus
  manager (SGLang's, with LOOKAHEAD's add, which passes the scope) on first
  use; SGLang's event loop then polls its background load as for NGRAM.

A removal while the corpus loads stops the load: the add then answers
``success: false`` ("removed while it loaded"), the removal ``success: true``.

Under tensor parallelism every rank must draft the same trees.  Each rank
loads the corpus on its own thread, and the loads end at different times; so
the corpus is published to drafts only when the load is committed, and the
manager commits it at the first poll where every rank's load has ended (an
``all_reduce`` over the TP CPU group, while a load is pending).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Optional

from lookahead.plugin.server_args import ALGORITHM_NAME

logger = logging.getLogger(__name__)

_tokenizer_side = False
_scheduler_side = False
_request_type = None


def _is_lookahead_server(server_args) -> bool:
    return str(getattr(server_args, "speculative_algorithm", "") or "").upper() == ALGORITHM_NAME


def request_type():
    """SGLang's add request with LOOKAHEAD's ``scope`` (made once per process,
    and registered with SGLang's IPC decoder)."""
    global _request_type
    if _request_type is None:
        from sglang.srt.managers import io_struct

        base = io_struct.AddExternalCorpusReqInput
        while getattr(base, "_LOOKAHEAD", False):
            base = base.__bases__[0]

        class LookaheadAddExternalCorpusReqInput(base, kw_only=True):
            scope: Optional[str] = None

        LookaheadAddExternalCorpusReqInput._LOOKAHEAD = True
        # Importable by name, for SGLang's pickle IPC (SGLANG_USE_PICKLE_IPC).
        LookaheadAddExternalCorpusReqInput.__module__ = __name__
        LookaheadAddExternalCorpusReqInput.__qualname__ = "LookaheadAddExternalCorpusReqInput"
        globals()["LookaheadAddExternalCorpusReqInput"] = LookaheadAddExternalCorpusReqInput
        io_struct.hook_custom_types(LookaheadAddExternalCorpusReqInput)
        _request_type = LookaheadAddExternalCorpusReqInput
    return _request_type


def __getattr__(name):
    # Made on first use (request_type), but any process may have to unpickle
    # one first: with --dp-size the data-parallel controller receives the add
    # request from the tokenizer manager before passing it on to every replica.
    if name == "LookaheadAddExternalCorpusReqInput":
        return request_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the HTTP server's process ---------------------------------------------------------


def _tokenizer_manager_init(original, self, server_args, *args, **kwargs):
    original(self, server_args, *args, **kwargs)
    if _is_lookahead_server(server_args):
        from sglang.srt.managers import io_struct

        # The route imports the name from io_struct at each call.
        # retire when: the add request carries algorithm-specific options.
        io_struct.AddExternalCorpusReqInput = request_type()
        self.lookahead_corpora = True


def _tokenize(tm, obj):
    """The add request's corpus as SGLang-style token chunks (in a thread)."""
    from lookahead.trie.corpora import ReadReport, read_corpus

    vocab = getattr(getattr(tm, "model_config", None), "vocab_size", None)
    max_id = int(vocab) - 1 if vocab else 2**31 - 1

    def encode(text):
        if tm.tokenizer is None:
            raise ValueError("the server has no tokenizer (--skip-tokenizer-init): send token_chunks")
        return tm.tokenizer.encode(text, add_special_tokens=False)

    report = ReadReport()
    if obj.file_path is not None:
        if not isinstance(obj.file_path, str):
            raise ValueError(f"file_path must be a string, got {type(obj.file_path).__name__}")
        return read_corpus(obj.file_path, encode, max_id, report), report
    if not isinstance(obj.documents, list) or not all(isinstance(d, str) for d in obj.documents):
        raise ValueError("documents must be a list of strings")
    chunks = []
    for doc in obj.documents:
        ids = list(encode(doc)) if doc else []
        if not ids:
            report.skip("empty documents")
            continue
        report.take(chunks, ids)
    return chunks, report


async def _add(original, self, obj):
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import AddExternalCorpusReqOutput

    if not getattr(self, "lookahead_corpora", False):
        return await original(self, obj)
    self.auto_create_handle_loop()
    try:
        if obj.corpus_id is not None and not isinstance(obj.corpus_id, str):
            raise ValueError(f"corpus_id must be a string, got {type(obj.corpus_id).__name__}")
        scope = getattr(obj, "scope", None)
        if scope is not None and not isinstance(scope, str):
            raise ValueError(f"scope must be a string such as \"cache_salt:X\", got {type(scope).__name__}")
        if not obj.corpus_id:
            import uuid

            obj.corpus_id = uuid.uuid4().hex
        note = ""
        if obj.file_path is not None or obj.documents is not None:
            chunks, report = await asyncio.to_thread(_tokenize, self, obj)
            obj.token_chunks = chunks
            if report.skipped:
                note = f" ({report})"
        elif obj.token_chunks is None:
            return AddExternalCorpusReqOutput(
                success=False, message="Either file_path, documents or token_chunks must be provided.")
        elif not isinstance(obj.token_chunks, list) or not all(isinstance(c, list) for c in obj.token_chunks):
            raise ValueError("token_chunks must be a list of lists of token ids")
        obj.file_path = None
        obj.documents = None
        results = await self.add_external_corpus_communicator(obj)
        all_success, all_message = FanOutCommunicator.merge_results(results)
        return AddExternalCorpusReqOutput(
            success=all_success,
            corpus_id=results[0].corpus_id if all_success else "",
            message=all_message + (note if all_success else ""),
            loaded_token_count=results[0].loaded_token_count if all_success else 0,
        )
    except Exception as exc:  # a bad body or file: an answer, never a crash
        return AddExternalCorpusReqOutput(success=False, message=str(exc))


async def _remove(original, self, corpus_id):
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import RemoveExternalCorpusReqInput, RemoveExternalCorpusReqOutput

    if not getattr(self, "lookahead_corpora", False):
        return await original(self, corpus_id)
    self.auto_create_handle_loop()
    if not isinstance(corpus_id, str):
        return RemoveExternalCorpusReqOutput(success=False, message="corpus_id must be a string.")
    results = await self.remove_external_corpus_communicator(RemoveExternalCorpusReqInput(corpus_id=corpus_id))
    all_success, all_message = FanOutCommunicator.merge_results(results)
    return RemoveExternalCorpusReqOutput(success=all_success, message=all_message)


async def _list(original, self):
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import ListExternalCorporaReqInput, ListExternalCorporaReqOutput

    if not getattr(self, "lookahead_corpora", False):
        return await original(self)
    self.auto_create_handle_loop()
    results = await self.list_external_corpora_communicator(ListExternalCorporaReqInput())
    all_success, all_message = FanOutCommunicator.merge_results(results)
    return ListExternalCorporaReqOutput(
        success=all_success,
        corpus_token_counts=results[0].corpus_token_counts if all_success else {},
        message=all_message,
    )


CORPUS_POSTS = ("/add_external_corpus", "/remove_external_corpus")


class JsonBodyCheck:
    """ASGI middleware: the corpus endpoints' bodies must be JSON objects.

    The body is read here whole (the routes read it whole too) and handed on
    unchanged; anything else passes straight through."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in CORPUS_POSTS:
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = body_problem(body)
        if problem is not None:
            import json

            content = json.dumps({"success": False, "message": f"{scope['path']}: {problem}"}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(content)).encode())]})
            await send({"type": "http.response.body", "body": content})
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def body_problem(body: bytes) -> Optional[str]:
    """Why a corpus request's body cannot be read, or None."""
    import json

    try:
        value = json.loads(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return f"the body must be a JSON object; it is not JSON ({exc})"
    if not isinstance(value, dict):
        return f"the body must be a JSON object, got {type(value).__name__}"
    return None


def _install_body_check() -> None:
    import sys

    if "sglang.srt.entrypoints.http_server" not in sys.modules and "sglang.srt.entrypoints.engine" in sys.modules:
        return  # an sgl.Engine in this process: no HTTP app to guard (and none to import)
    from sglang.srt.entrypoints import http_server

    try:
        # Outermost: the check runs before SGLang's routes parse the body.
        http_server.app.add_middleware(JsonBodyCheck)
    except RuntimeError as exc:  # the app is serving already (not a launch_server start)
        logger.warning("LOOKAHEAD: the corpus endpoints' body check is not installed: %s", exc)


def install_tokenizer_side() -> None:
    """Register the HTTP-side hooks (idempotent; applied by ``load_plugins``)."""
    global _tokenizer_side
    if _tokenizer_side:
        return
    from lookahead.plugin.hooks import _register_and_apply

    mixin = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin"
    _register_and_apply((
        # retire when: the add request carries algorithm-specific options (our scope).
        ("sglang.srt.managers.tokenizer_manager.TokenizerManager.__init__", _tokenizer_manager_init),
        # retire when: the endpoints are gated on a capability the algorithm
        # declares (supports_external_corpus) instead of is_ngram(), and the
        # worker reads the corpus file.
        (f"{mixin}.add_external_corpus", _add),
        (f"{mixin}.remove_external_corpus", _remove),
        (f"{mixin}.list_external_corpora", _list),
    ))
    _install_body_check()
    _tokenizer_side = True


# -- the scheduler -----------------------------------------------------------------------


_manager_class = None


def manager_class():
    """SGLang's ``ExternalCorpusManager`` for LOOKAHEAD (made once): the
    worker's add also gets the scope, the list's message describes each
    corpus, and under tensor parallelism (``tp_group``) a load is committed
    on every rank at the same poll."""
    global _manager_class
    if _manager_class is not None:
        return _manager_class
    from sglang.srt.speculative.external_corpus_manager import ExternalCorpusManager

    class LookaheadCorpusManager(ExternalCorpusManager):
        def __init__(self, draft_worker, send_response, tp_group=None):
            super().__init__(draft_worker, send_response)
            self._tp_group = tp_group

        def add(self, recv_req):
            from sglang.srt.managers.io_struct import AddExternalCorpusReqOutput

            if self._pending_load is not None:
                return AddExternalCorpusReqOutput(success=False,
                                                  message="Another corpus load is already in progress.")

            def build():
                try:
                    loaded = self._worker.add_external_corpus(
                        recv_req.corpus_id, recv_req.token_chunks, getattr(recv_req, "scope", None))
                    self._load_result = AddExternalCorpusReqOutput(
                        success=True, corpus_id=recv_req.corpus_id,
                        message=f"Loaded corpus '{recv_req.corpus_id}' with {loaded} tokens.",
                        loaded_token_count=loaded)
                except Exception as exc:
                    self._load_result = AddExternalCorpusReqOutput(success=False, message=str(exc))

            thread = threading.Thread(target=build, name="lookahead-corpus-add", daemon=True)
            self._pending_load = (recv_req, thread)
            thread.start()
            return None

        def check_pending_load(self):
            # Under tensor parallelism the load is committed (and the corpus
            # published to drafts, see the worker) at the first poll where
            # every rank's load has ended: every rank polls at the same point
            # of the same loop iteration, and the add reached them all in the
            # same iteration.
            if self._pending_load is not None and self._tp_group is not None:
                if not all_done(self._tp_group, not self._pending_load[1].is_alive()):
                    return
            super().check_pending_load()

        def list(self, recv_req):
            # NGRAM's body; the message also gives each corpus's bytes, scope and state.
            out = super().list(recv_req)
            if out.success:
                out.message = self._worker.describe_external_corpora()
            return out

    _manager_class = LookaheadCorpusManager
    return _manager_class


def _manager(scheduler):
    """The scheduler's corpus manager, made for LOOKAHEAD on first use."""
    if scheduler.external_corpus_manager is None and getattr(scheduler.spec_algorithm, "name", None) == \
            ALGORITHM_NAME and scheduler.draft_worker is not None:
        tp_group = scheduler.tp_cpu_group if getattr(scheduler, "tp_size", 1) > 1 else None
        scheduler.external_corpus_manager = manager_class()(
            scheduler.draft_worker, scheduler.ipc_channels.send_to_tokenizer.send_output, tp_group)
    return scheduler.external_corpus_manager


def all_done(group, done: bool) -> bool:
    """Whether ``done`` holds on every rank of ``group`` (a collective: every
    rank must call it at the same point)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if done else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _scheduler_add(original, self, recv_req):
    _manager(self)
    return original(self, recv_req)


def _scheduler_remove(original, self, recv_req):
    _manager(self)
    return original(self, recv_req)


def _scheduler_list(original, self, recv_req):
    _manager(self)
    return original(self, recv_req)


def install_scheduler_side() -> None:
    """Register and apply the scheduler's hooks (idempotent); called by the
    worker's constructor, before the scheduler binds its request handlers."""
    global _scheduler_side
    if _scheduler_side:
        return
    from lookahead.plugin.hooks import _register_and_apply

    request_type()  # the scheduler decodes LOOKAHEAD's add requests
    scheduler = "sglang.srt.managers.scheduler.Scheduler"
    # retire when: the scheduler builds the corpus manager for any algorithm
    # that declares supports_external_corpus() and passes the whole request
    # (with its scope) to the worker.
    _register_and_apply((
        (f"{scheduler}.add_external_corpus", _scheduler_add),
        (f"{scheduler}.remove_external_corpus", _scheduler_remove),
        (f"{scheduler}.list_external_corpora", _scheduler_list),
    ))
    _scheduler_side = True
