"""The logs SGLang users already have, read as replay requests.

An operator asking "will LOOKAHEAD help my traffic?" has logs, not this
project's token-id traces. ``read_trace`` reads each of these, telling them
apart by content, line by line:

* **token ids**: ``{"prompt": [ids], "response": [ids]}`` per line (this
  project's format, that of its recorded replay traces);
* **SGLang request logs**: what ``--log-requests --log-requests-level 3
  --log-requests-format json --log-requests-target DIR`` writes, a file or
  the directory (its files, per host and rank, merged by timestamp). Each
  ``request.finished`` event is a request: the token ids SGLang logged where
  it has them (chat requests, ``input_ids`` prompts, every output), else its
  text tokenized;
* **ShareGPT** conversations (``{"conversations": [{"from", "value"}]}``, a
  JSON array or one per line, as ``bench_serving`` reads them);
* **OpenAI chat logs**: ``{"messages": [...]}`` with the answer as a
  ``"response"`` (a string or a chat completion) or as the last message,
  optionally under ``"request"`` / ``"body"``.

In a conversation every assistant turn is one request whose prompt is the
conversation before it, rendered with the tokenizer's chat template (as
SGLang's chat endpoint renders it). A line that cannot be used is counted
by reason, never a crash; a file with no usable line is a ``TraceError``.

The requests are written to a temporary file of int32 tokens as they are
read and replayed from it as memory-mapped views, so a log of any size is
read once and replayed for every budget and drafter with flat memory: what
stays in memory per request is its offsets and scope, a few dozen bytes.
"""

from __future__ import annotations

import array
import collections
import gzip
import heapq
import itertools
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Iterator, Optional

import numpy as np

# How SGLang's request logger prefixes each JSON line (logging.Formatter).
_SGLANG_LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] ")
# SGLang's request logger truncates strings and lists beyond this below level 3,
# keeping both halves around a "..." (``_transform_data_for_logging``).
_SGLANG_LEVEL2_MAX = 2048
# The rids of the one-token requests SGLang's ``/health`` sends itself
# (``sglang.srt.constants.HEALTH_CHECK_RID_PREFIX``).
_HEALTH_CHECK_PREFIX = "HEALTH_CHECK"
_ASSISTANT = {"assistant", "gpt", "chatgpt", "bard", "bing", "model"}
_USER = {"user", "human"}
_SYSTEM = {"system", "developer"}
# Where a line may carry a field asked for by --scope-by (cache_salt, extra_key, ...).
_FIELD_HOLDERS = ("obj", "request", "body")


class TraceError(ValueError):
    """The file cannot be replayed at all (nothing usable, or text without a tokenizer)."""


class _Unusable(Exception):
    """One line cannot be used; its message is the reason it is counted under."""


@dataclass
class TraceStats:
    path: str
    formats: collections.Counter = field(default_factory=collections.Counter)  # requests by format
    lines: int = 0
    requests: int = 0
    skipped: collections.Counter = field(default_factory=collections.Counter)  # lines by reason
    ignored: int = 0  # SGLang log events other than request.finished (expected, not errors)

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in self.formats.most_common()) or "none"
        text = f"{self.path}: {self.lines} lines, {self.requests} requests ({kinds})"
        if self.ignored:
            text += f", {self.ignored} other log events ignored"
        if self.skipped:
            reasons = "; ".join(f"{n} {r}" for r, n in self.skipped.most_common())
            text += f"; {sum(self.skipped.values())} lines skipped: {reasons}"
        return text


class ReplayTrace:
    """Requests read from a trace, replayed as ``(prompt, response)`` int32
    views of a memory-mapped temporary file; ``scopes[i]`` is request i's
    ``scope_field`` value (None where absent)."""

    def __init__(self, stats: TraceStats, directory: tempfile.TemporaryDirectory, tokens_path: str,
                 starts: np.ndarray, prompt_lens: np.ndarray, response_lens: np.ndarray, scopes: list):
        self.stats = stats
        self._dir = directory
        self._starts, self._prompt_lens, self._response_lens = starts, prompt_lens, response_lens
        self.scopes = scopes
        total = int(starts[-1] + prompt_lens[-1] + response_lens[-1]) if len(starts) else 0
        self._tokens = np.memmap(tokens_path, dtype=np.int32, mode="r", shape=(max(total, 1),))

    def __len__(self) -> int:
        return len(self._starts)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start, plen, rlen in zip(self._starts.tolist(), self._prompt_lens.tolist(),
                                     self._response_lens.tolist()):
            yield (np.asarray(self._tokens[start: start + plen]),
                   np.asarray(self._tokens[start + plen: start + plen + rlen]))

    def close(self) -> None:
        self._tokens = None
        self._dir.cleanup()


def read_trace(path: str, tokenizer=None, *, scope_field: Optional[str] = None, limit: Optional[int] = None,
               progress: Optional[Callable[[str], None]] = None) -> ReplayTrace:
    """Read every request of ``path`` (a file, optionally gzipped, or an SGLang
    log directory). ``tokenizer``: a ``transformers`` tokenizer, or the path
    of a local one, for logs that hold text."""
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(str(tokenizer))
    stats = TraceStats(str(path))
    directory = tempfile.TemporaryDirectory(prefix="lookahead-replay-")
    tokens_path = os.path.join(directory.name, "tokens.i32")
    starts, plens, rlens = array.array("q"), array.array("q"), array.array("q")
    scopes = []
    offset = 0
    last_report = time.monotonic()
    try:
        with open(tokens_path, "wb") as out:
            for record in _records(str(path), stats) if limit is None or limit > 0 else ():
                try:
                    requests = _requests_of(record, tokenizer, stats)
                except _Unusable as why:
                    stats.skipped[str(why)] += 1
                    continue
                for fmt, prompt, response in requests:
                    if limit is not None and stats.requests >= limit:
                        break
                    prompt = np.asarray(prompt, dtype=np.int32)
                    response = np.asarray(response, dtype=np.int32)
                    out.write(prompt.tobytes())
                    out.write(response.tobytes())
                    starts.append(offset)
                    plens.append(len(prompt))
                    rlens.append(len(response))
                    offset += len(prompt) + len(response)
                    scopes.append(_field(record, scope_field) if scope_field else None)
                    stats.requests += 1
                    stats.formats[fmt] += 1
                if limit is not None and stats.requests >= limit:
                    break
                if progress is not None and time.monotonic() - last_report > 2.0:
                    last_report = time.monotonic()
                    progress(f"{path}: {stats.lines} lines read, {stats.requests} requests")
    except BaseException:
        directory.cleanup()
        raise
    if not stats.requests:
        directory.cleanup()
        raise TraceError(f"{path}: no usable request in {stats.lines} lines"
                         + (f" ({'; '.join(f'{n} {r}' for r, n in stats.skipped.most_common())})"
                            if stats.skipped else ""))
    return ReplayTrace(stats, directory, tokens_path, np.frombuffer(starts, dtype=np.int64),
                       np.frombuffer(plens, dtype=np.int64), np.frombuffer(rlens, dtype=np.int64), scopes)


def load_tokenizer(path: str):
    """A local tokenizer (never downloaded)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise TraceError(f"cannot load a tokenizer from {path!r}: {exc}") from None


# -- lines -----------------------------------------------------------------------


def _records(path: str, stats: TraceStats) -> Iterator[dict]:
    """The JSON objects of a file or SGLang log directory, in log order."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, name) for name in os.listdir(path)
                       if os.path.isfile(os.path.join(path, name)))
        if not files:
            raise TraceError(f"{path}: an empty directory")
        # Each file is in the order its logger wrote it; the files (hosts,
        # ranks, hourly rotations) are merged by the lines' timestamps.
        streams = [((_timestamp(rec), i, n, rec) for n, rec in enumerate(_file_records(f, stats)))
                   for i, f in enumerate(files)]
        for _, _, _, rec in heapq.merge(*streams, key=lambda item: item[:3]):
            yield rec
    else:
        yield from _file_records(path, stats)


def _file_records(path: str, stats: TraceStats) -> Iterator[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        head = f.read(1 << 16)
        start = head.lstrip()
        if start.startswith("[") and not _SGLANG_LOG_PREFIX.match(start):
            yield from _json_array(head, f, stats)
            return
        pending = ""
        for chunk in itertools.chain([head], iter(lambda: f.read(1 << 20), "")):
            lines = (pending + chunk).split("\n")
            pending = lines.pop()
            for line in lines:
                rec = _line_record(line, stats)
                if rec is not None:
                    yield rec
        rec = _line_record(pending, stats)
        if rec is not None:
            yield rec


def _line_record(line: str, stats: TraceStats) -> Optional[dict]:
    line = line.strip()
    if not line:
        return None
    stats.lines += 1
    prefix = _SGLANG_LOG_PREFIX.match(line)
    if prefix:
        line = line[prefix.end():]
    try:
        rec = json.loads(line)
    except ValueError:
        stats.skipped["not JSON"] += 1
        return None
    if not isinstance(rec, dict):
        stats.skipped["not a JSON object"] += 1
        return None
    return rec


def _json_array(head: str, f, stats: TraceStats) -> Iterator[dict]:
    """The elements of a top-level JSON array, decoded one at a time."""
    decoder = json.JSONDecoder()
    buf, pos, eof, want = head[head.index("[") + 1:], 0, False, 1 << 20
    while True:
        while True:  # past the separators, reading on where the buffer ends
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) or eof:
                break
            buf, pos = f.read(want), 0
            eof = not buf
        if pos >= len(buf):
            stats.skipped["JSON array not closed"] += 1
            return
        if buf[pos] == "]":
            return
        try:
            rec, end = decoder.raw_decode(buf, pos)
            complete = end < len(buf) or eof  # a number could go on in the next read
        except ValueError:
            if eof:
                stats.lines += 1
                stats.skipped["not JSON"] += 1
                return
            complete = False
        if not complete:
            more = f.read(want)
            want *= 2  # an element longer than what was read: read more at once
            eof = not more
            buf, pos = buf[pos:] + more, 0
            continue
        want, pos = 1 << 20, end
        stats.lines += 1
        if isinstance(rec, dict):
            yield rec
        else:
            stats.skipped["not a JSON object"] += 1


def _timestamp(rec: dict) -> float:
    value = rec.get("timestamp")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            pass
    return float("-inf")  # no timestamp: where its file puts it


def _field(rec: dict, name: str) -> Optional[str]:
    for holder in (rec, *(rec.get(h) for h in _FIELD_HOLDERS)):
        if isinstance(holder, dict) and holder.get(name) is not None:
            return str(holder[name])
    return None


# -- records to requests ------------------------------------------------------------


def _requests_of(rec: dict, tokenizer, stats: TraceStats) -> list:
    """``[(format, prompt ids, response ids)]`` of one record."""
    if "event" in rec and "obj" in rec:
        # SGLang's own health probes (``/health`` sends a one-token request)
        # are logged like requests; they are not traffic.
        if rec["event"] != "request.finished" or str(rec.get("rid", "")).startswith(_HEALTH_CHECK_PREFIX):
            stats.ignored += 1
            return []
        return [("sglang-log", p, r) for p, r in _sglang_request(rec, tokenizer)]
    if isinstance(rec.get("prompt"), list) and isinstance(rec.get("response"), list):
        if not (_is_ids(rec["prompt"]) and _is_ids(rec["response"])):
            raise _Unusable("token ids that are not non-negative integers")
        return [("token-ids", rec["prompt"], rec["response"])]
    if isinstance(rec.get("conversations") or rec.get("conversation"), list):
        turns = [_sharegpt_turn(t) for t in rec.get("conversations") or rec.get("conversation")]
        return [("sharegpt", p, r) for p, r in _conversation_requests(turns, tokenizer)]
    body = next((h for h in (rec, rec.get("request"), rec.get("body")) if isinstance(h, dict)
                 and isinstance(h.get("messages"), list)), None)
    if body is not None:
        turns = [_openai_turn(m) for m in body["messages"]]
        answer = _openai_answer(rec.get("response", body.get("response")))
        if answer is not None:
            turns.append(("assistant", answer))
        return [("openai", p, r) for p, r in _conversation_requests(turns, tokenizer)]
    raise _Unusable("of no known format")


def _is_ids(value) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _needs(tokenizer, what: str):
    if tokenizer is None:
        raise TraceError(f"this trace holds {what} as text: pass --tokenizer PATH (the model's local tokenizer)")
    return tokenizer


def _encode(tokenizer, text: str, special: bool) -> list:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _truncated(value) -> bool:
    """Whether SGLang's logger (below level 3) cut this string or list."""
    if isinstance(value, list):
        return "..." in value
    half = _SGLANG_LEVEL2_MAX // 2
    return isinstance(value, str) and len(value) == _SGLANG_LEVEL2_MAX + 3 and value[half: half + 3] == "..."


def _sglang_request(rec: dict, tokenizer) -> list:
    obj, out = rec["obj"], rec.get("out")
    if not isinstance(obj, dict) or not isinstance(out, dict):
        raise _Unusable("SGLang log event without its request or output (log level 0-1?)")
    ids, text = obj.get("input_ids"), obj.get("text")
    if isinstance(ids, list) and ids and isinstance(ids[0], list) or isinstance(text, list):
        raise _Unusable("SGLang log of a batch request")
    if _truncated(ids) or _truncated(text) or _truncated(out.get("output_ids")) or _truncated(out.get("text")):
        raise _Unusable("SGLang log truncated (use --log-requests-level 3)")
    if _is_ids(ids) and ids:
        prompt = ids
    elif isinstance(text, str) and text:
        # SGLang tokenizes a text prompt with the tokenizer's special tokens.
        prompt = _encode(_needs(tokenizer, "prompts"), text, special=True)
    else:
        raise _Unusable("SGLang log without the prompt (log level 0-1, or embeddings)")
    meta = out.get("meta_info") if isinstance(out.get("meta_info"), dict) else {}
    output_ids = out.get("output_ids")
    if _is_ids(output_ids) and (meta.get("completion_tokens") in (None, len(output_ids))):
        response = output_ids
    elif isinstance(out.get("text"), str) and meta.get("completion_tokens") is None:
        response = _encode(_needs(tokenizer, "outputs"), out["text"], special=False)
    else:
        raise _Unusable("SGLang log without the whole output (incremental streaming logs the last chunk)")
    if not response:
        raise _Unusable("empty response")
    return [(prompt, response)]


def _sharegpt_turn(turn) -> tuple:
    if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
        raise _Unusable("conversation turn without a text value")
    return _role(turn.get("from")), turn["value"]


def _openai_turn(message) -> tuple:
    if not isinstance(message, dict):
        raise _Unusable("chat message that is not an object")
    content = message.get("content")
    if isinstance(content, list):  # content parts: the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    if not isinstance(content, str):
        raise _Unusable("chat message without text content")
    return _role(message.get("role")), content


def _openai_answer(response) -> Optional[str]:
    """A response string, or a chat completion's first choice."""
    if isinstance(response, str):
        return response
    if isinstance(response, dict):
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message") or {}
            content = message.get("content") if isinstance(message, dict) else None
            if content is None:
                content = choices[0].get("text")
            if isinstance(content, str):
                return content
        raise _Unusable("response without a text answer")
    return None


def _role(name) -> str:
    name = str(name).lower()
    if name in _ASSISTANT:
        return "assistant"
    if name in _USER:
        return "user"
    if name in _SYSTEM:
        return "system"
    raise _Unusable(f"conversation role {name!r}")


def _conversation_requests(turns: list, tokenizer) -> list:
    """Every assistant turn, with the conversation before it as its prompt."""
    requests = []
    for i, (role, text) in enumerate(turns):
        if role != "assistant" or not text or i == 0:
            continue
        tok = _needs(tokenizer, "conversations")
        history = [{"role": r, "content": t} for r, t in turns[:i]]
        try:
            rendered = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        except Exception as exc:
            if not getattr(tok, "chat_template", None):
                raise TraceError("the tokenizer has no chat template: conversations cannot be rendered") from None
            raise _Unusable(f"chat template failed ({type(exc).__name__})") from None
        # The template writes the special tokens itself (as SGLang's chat endpoint renders it).
        response = _encode(tok, text, special=False)
        if response:
            requests.append((_encode(tok, rendered, special=False), response))
    if not requests:
        raise _Unusable("conversation without an assistant turn after a prompt")
    return requests
