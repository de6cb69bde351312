"""The replay reads the logs users already have (``lookahead.replay.formats``).

One fixture per format, written here: token ids, ShareGPT (a JSON array and
one conversation per line), OpenAI chat logs, and SGLang's own JSON request
logs from a real CPU server started with request logging, so that a change
in what SGLang logs is caught. The same requests give the same AL whichever
format carries them; bad lines are counted, and a file with nothing usable is
a clear error.
"""

from __future__ import annotations

import gzip
import inspect
import json
import tracemalloc
import urllib.request

import numpy as np
import pytest

from lookahead.replay import main as replay_main
from lookahead.replay import make_drafter, replay
from lookahead.replay.formats import TraceError, load_tokenizer, read_trace
from cpu_env import cpu_server_args
from lookahead.validate.server import SGLangServer


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def _sources() -> list[str]:
    """Short local texts to build conversations from (stdlib functions)."""
    import json.decoder
    import textwrap as tw

    fns = [tw.dedent, tw.indent, json.decoder.py_scanstring, json.decoder.JSONObject, json.decoder.JSONArray]
    return [inspect.getsource(f)[:700] for f in fns]


def _conversations() -> list[list[tuple[str, str]]]:
    """Copy-heavy chats: quote a function, then quote it again with a change."""
    convs = []
    for i, src in enumerate(_sources()):
        turns = [("user", f"Here is a function:\n\n{src}\nRepeat it exactly."), ("assistant", src),
                 ("user", "Now rename its first argument to `value` and repeat it."),
                 ("assistant", src.replace("(text", "(value").replace("(s,", "(value,"))]
        if i % 2:
            turns.insert(0, ("system", "You are a careful assistant."))
        convs.append(turns)
    return convs


def _reference_pairs(tokenizer, convs) -> list[tuple[list, list]]:
    """Every assistant turn as (rendered conversation before it, its tokens),
    computed here directly with the tokenizer's chat template."""
    pairs = []
    for turns in convs:
        for i, (role, text) in enumerate(turns):
            if role == "assistant":
                msgs = [{"role": r, "content": t} for r, t in turns[:i]]
                rendered = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                pairs.append((tokenizer(rendered, add_special_tokens=False)["input_ids"],
                              tokenizer(text, add_special_tokens=False)["input_ids"]))
    return pairs


def _write_jsonl(path, rows, gz=False) -> str:
    opener = gzip.open if gz else open
    with opener(path, "wt") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def _sharegpt(turns) -> dict:
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    return {"id": "x", "conversations": [{"from": names[r], "value": t} for r, t in turns]}


def _openai(turns, style: int) -> dict:
    msgs = [{"role": r, "content": t} for r, t in turns]
    if style == 0:  # the answer as the last message
        return {"messages": msgs}
    *msgs, last = msgs
    if style == 1:  # a plain response string
        return {"messages": msgs, "response": last["content"]}
    # a logged request body and chat completion, with content parts
    msgs = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in msgs]
    return {"request": {"model": "m", "messages": msgs},
            "response": {"object": "chat.completion", "choices": [{"index": 0, "message": last}]}}


def _pairs(trace) -> list[tuple[list, list]]:
    return [(p.tolist(), r.tolist()) for p, r in trace]


def _al(trace_or_pairs, budget: int = 4) -> float:
    pairs = [(np.asarray(p, np.int32), np.asarray(r, np.int32)) for p, r in trace_or_pairs]
    drafter = make_drafter("lookahead", budget)
    try:
        return replay(drafter, pairs, budget).acceptance_length
    finally:
        drafter.cache.close()


def test_every_conversation_format_gives_the_same_requests_and_al(tokenizer, tmp_path):
    convs = _conversations()
    ref = _reference_pairs(tokenizer, convs)
    files = {
        "token-ids": _write_jsonl(tmp_path / "ids.jsonl.gz", [{"prompt": p, "response": r} for p, r in ref], gz=True),
        "sharegpt array": str(tmp_path / "sharegpt.json"),
        "sharegpt lines": _write_jsonl(tmp_path / "sharegpt.jsonl", [_sharegpt(t) for t in convs]),
        "openai": _write_jsonl(tmp_path / "openai.jsonl", [_openai(t, i % 3) for i, t in enumerate(convs)]),
    }
    (tmp_path / "sharegpt.json").write_text(json.dumps([_sharegpt(t) for t in convs], indent=1))
    als = {}
    for name, path in files.items():
        trace = read_trace(path, tokenizer)
        try:
            assert trace.stats.requests == len(ref) == 2 * len(convs), (name, trace.stats.summary())
            assert not trace.stats.skipped, (name, trace.stats.summary())
            assert _pairs(trace) == ref, name
            als[name] = _al(trace)
        finally:
            trace.close()
    assert len(set(als.values())) == 1, als
    assert als["token-ids"] > 1.5  # the fixture copies: a trie that reads it must accept


def test_bad_lines_are_counted_and_the_rest_replayed(tokenizer, tmp_path):
    convs = _conversations()
    rows = [_sharegpt(convs[0]), "{not json", "[1, 2]", {"hello": "world"},
            {"conversations": [{"from": "alien", "value": "hi"}, {"from": "gpt", "value": "x"}]},
            {"conversations": [{"from": "human", "value": "a question, never answered"}]},
            {"prompt": [1, 2, -3], "response": [4]}, "", _openai(convs[1], 1)]
    trace = read_trace(_write_jsonl(tmp_path / "mixed.jsonl", rows), tokenizer)
    try:
        stats = trace.stats
        assert stats.requests == 4 and stats.lines == 8
        assert stats.formats == {"sharegpt": 2, "openai": 2}
        assert stats.skipped == {"not JSON": 1, "not a JSON object": 1, "of no known format": 1,
                                 "token ids that are not non-negative integers": 1,
                                 "conversation role 'alien'": 1,
                                 "conversation without an assistant turn after a prompt": 1}
        assert "6 lines skipped" in stats.summary()
        assert _pairs(trace) == _reference_pairs(tokenizer, convs[:2])
    finally:
        trace.close()


def test_nothing_usable_is_a_clear_error(tokenizer, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TraceError, match="no usable request in 0 lines"):
        read_trace(str(empty), tokenizer)
    junk = _write_jsonl(tmp_path / "junk.jsonl", ["nope", {"a": 1}])
    with pytest.raises(TraceError, match=r"no usable request in 2 lines \(1 not JSON; 1 of no known format\)"):
        read_trace(junk, tokenizer)
    # Text without a tokenizer: said once, not a line-by-line skip.
    chats = _write_jsonl(tmp_path / "chats.jsonl", [_sharegpt(t) for t in _conversations()])
    with pytest.raises(TraceError, match="pass --tokenizer PATH"):
        read_trace(chats)
    assert replay_main(["--trace", junk, "--no-plot", "--out-dir", str(tmp_path / "o")]) == 2
    assert "error:" in capsys.readouterr().err
    assert replay_main(["--trace", str(tmp_path / "missing.jsonl"), "--no-plot"]) == 2
    assert replay_main(["--trace", chats, "--tokenizer", str(tmp_path / "no-tokenizer-here")]) == 2


def _peak_bytes_reading(path) -> tuple:
    tracemalloc.start()
    try:
        trace = read_trace(str(path))
        return trace, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_large_files_stream_with_flat_memory(tmp_path):
    # Reading 8x the requests (4.5M tokens, 18 MB as int32, in a JSON array)
    # takes about the same memory: tokens go to the memory-mapped file.
    rng = np.random.default_rng(0)
    row = lambda: {"prompt": rng.integers(0, 2000, 1500).tolist(), "response": rng.integers(0, 2000, 20).tolist()}
    peaks = {}
    for n in (375, 3000):
        path = tmp_path / f"big{n}.json"
        path.write_text(json.dumps([row() for _ in range(n)]))
        trace, peaks[n] = _peak_bytes_reading(path)
        try:
            assert len(trace) == n and sum(len(p) + len(r) for p, r in trace) == 1520 * n
        finally:
            trace.close()
    assert peaks[3000] < peaks[375] + 1e6, peaks
    assert peaks[3000] < 4 * 1520 * 3000 / 3, peaks  # a third of the int32 tokens alone


def test_a_json_array_element_longer_than_a_read(tmp_path):
    big = {"prompt": list(range(400_000)), "response": [1, 2, 3]}  # ~3 MB of JSON: several reads
    path = tmp_path / "one.json"
    path.write_text(json.dumps([{"prompt": [5], "response": [6]}, big, {"prompt": [7], "response": [8]}, 12]))
    trace = read_trace(str(path))
    try:
        assert _pairs(trace) == [([5], [6]), (big["prompt"], [1, 2, 3]), ([7], [8])]
        assert trace.stats.skipped == {"not a JSON object": 1}
    finally:
        trace.close()


# -- SGLang's own request logs, from a real server ------------------------------------


def _post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _stream(url: str, payload: dict) -> list:
    req = urllib.request.Request(url, data=json.dumps({**payload, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                chunks.append(json.loads(line[5:]))
    return chunks


@pytest.fixture(scope="module")
def sglang_log(tiny_model, cpu_subprocess_env, tmp_path_factory, tokenizer):
    """A plain CPU server's JSON request log directory, and what each request
    was, seen from the client: (prompt ids, output ids, cache_salt)."""
    base = tmp_path_factory.mktemp("sglang_log")
    log_dir = base / "requests"
    args = cpu_server_args(max_running_requests=4, max_total_tokens=8192) + [
        "--log-requests", "--log-requests-level", "3", "--log-requests-format", "json",
        "--log-requests-target", str(log_dir),
        "--skip-server-warmup"]  # its warm-up request would be logged too
    sent = []
    sampling = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}
    srcs = _sources()
    with SGLangServer(tiny_model, args, cpu_subprocess_env, base / "server.log") as server:
        for i, src in enumerate(srcs[:3]):
            text = f"Repeat this:\n{src}\n"
            extra = {"cache_salt": f"tenant-{i % 2}"} if i else {}
            out = _post(server.url + "/generate", {"text": text, "sampling_params": sampling, **extra})
            prompt = tokenizer(text)["input_ids"]
            # The server's own count of the prompt: the log is tokenized as it was.
            assert out["meta_info"]["prompt_tokens"] == len(prompt)
            sent.append((prompt, out["output_ids"], extra.get("cache_salt")))
        ids = tokenizer(srcs[3], add_special_tokens=False)["input_ids"]
        out = _post(server.url + "/generate", {"input_ids": ids, "sampling_params": sampling})
        sent.append((ids, out["output_ids"], None))
        chunks = _stream(server.url + "/generate", {"text": srcs[4], "sampling_params": sampling})
        sent.append((tokenizer(srcs[4])["input_ids"], chunks[-1]["output_ids"], None))
        chat = [{"role": "user", "content": "Say something about " + srcs[0][:200]}]
        resp = _post(server.url + "/v1/chat/completions",
                     {"model": "m", "messages": chat, "max_tokens": 16, "temperature": 0, "cache_salt": "tenant-9"})
        sent.append(("chat", chat, resp))
    return log_dir, sent


def test_sglang_request_log_gives_the_requests_the_server_saw(sglang_log, tokenizer, tmp_path):
    log_dir, sent = sglang_log
    files = list(log_dir.iterdir())
    assert files, "SGLang wrote no request log"
    trace = read_trace(str(log_dir), tokenizer, scope_field="cache_salt")
    try:
        stats = trace.stats
        assert stats.formats == {"sglang-log": len(sent)}, stats.summary()
        assert not stats.skipped, stats.summary()
        assert stats.ignored >= len(sent)  # the request.received events
        got = _pairs(trace)
        # /generate requests, in the order they were served (one at a time).
        for (prompt, output, salt), (p, r), scope in zip(sent[:-1], got, trace.scopes):
            assert (p, r, scope) == (prompt, output, salt)
        # The chat request: SGLang rendered it with the chat template exactly as
        # the replay renders conversations, and logged every output token.
        _, chat, resp = sent[-1]
        p, r = got[-1]
        assert p == _reference_pairs(tokenizer, [[("user", chat[0]["content"]), ("assistant", "x")]])[0][0]
        assert len(r) == resp["usage"]["completion_tokens"] and trace.scopes[-1] == "tenant-9"
        ids_file = _write_jsonl(tmp_path / "ids.jsonl", [{"prompt": a, "response": b} for a, b in got])
        assert _al(trace) == _al(read_trace(ids_file))
    finally:
        trace.close()
    # A log file given alone reads the same.
    single = read_trace(str(files[0]), tokenizer)
    try:
        assert single.stats.requests == len(sent)
    finally:
        single.close()


def test_replay_cli_reads_a_log_and_recommends(sglang_log, tiny_model, tmp_path, capsys):
    log_dir, sent = sglang_log
    out_dir = tmp_path / "out"
    assert replay_main(["--trace", str(log_dir), "--tokenizer", tiny_model, "--budget", "4", "7",
                        "--drafters", "lookahead,lookahead-1b,prompt-lookup", "--no-plot", "--quiet",
                        "--scope-by", "cache_salt", "--out-dir", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert f"{len(sent)} requests ({len(sent)} sglang-log)" in out
    assert "## Recommendation" in out
    rows = json.loads((out_dir / "replay.json").read_text())
    # With --scope-by, LOOKAHEAD is replayed scoped as the server would scope it.
    scoped = [r for r in rows if r["split"] == "by cache_salt"]
    tree = {r["budget"]: r["acceptance_length"] for r in scoped if r["drafter"] == "lookahead"}
    chain = {r["budget"]: r["acceptance_length"] for r in scoped if r["drafter"] == "lookahead-1b"}
    assert sorted(tree) == sorted(chain) == [4, 7]
    # The recommendation is the best estimated speed-up under the stated cost model.
    options = [(al / (1 + 0.01 * b), -b, mode) for mode, als in (("tree", tree), ("1b", chain)) for b, al in als.items()]
    _, neg_budget, mode = max(options)
    flags = f"--speculative-num-draft-tokens {-neg_budget + 1}" + (" --speculative-one-branch" if mode == "1b" else "")
    assert f"Start with `--speculative-algorithm LOOKAHEAD {flags}`" in out
    assert "by cache_salt" in out


def test_truncated_and_partial_sglang_logs_are_skipped_with_reasons(tmp_path, tokenizer):
    def event(obj, out, name="request.finished"):
        return "[2026-12-02 10:00:00] " + json.dumps({"timestamp": "2026-12-02T10:00:00", "event": name,
                                                      "rid": "r", "obj": obj, "out": out})

    half = "a" * 1024
    rows = [
        event({"text": "hello there"}, {"text": " ok", "output_ids": [5, 6], "meta_info": {"completion_tokens": 2}}),
        event({"text": half + "..." + half}, {"output_ids": [5], "meta_info": {}}),
        event({"input_ids": [1, 2, 3]}, {"output_ids": [9], "meta_info": {"completion_tokens": 4}}),
        event({"rid": "r"}, {"meta_info": {}}),
        event({"text": "x"}, None, name="request.received"),
    ]
    trace = read_trace(_write_jsonl(tmp_path / "host_0.log", rows), tokenizer)
    try:
        assert trace.stats.requests == 1 and trace.stats.ignored == 1
        assert trace.stats.skipped == {
            "SGLang log truncated (use --log-requests-level 3)": 1,
            "SGLang log without the whole output (incremental streaming logs the last chunk)": 1,
            "SGLang log without the prompt (log level 0-1, or embeddings)": 1}
        assert _pairs(trace) == [(tokenizer("hello there")["input_ids"], [5, 6])]
    finally:
        trace.close()


def test_log_directory_files_merge_by_timestamp(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()

    def line(ts, n):
        return f"[2026-12-02 10:00:0{ts}] " + json.dumps(
            {"timestamp": f"2026-12-02T10:00:0{ts}", "event": "request.finished", "rid": str(n),
             "obj": {"input_ids": [n, n]}, "out": {"output_ids": [n], "meta_info": {"completion_tokens": 1}}})

    (d / "a_0.log").write_text(line(1, 1) + "\n" + line(4, 4) + "\n")
    (d / "b_1.log").write_text(line(2, 2) + "\n" + line(3, 3) + "\n" + line(5, 5) + "\n")
    trace = read_trace(str(d))
    try:
        assert [p.tolist() for p, _ in trace] == [[n, n] for n in (1, 2, 3, 4, 5)]
    finally:
        trace.close()
