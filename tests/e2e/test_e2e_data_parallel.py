"""LOOKAHEAD under data parallelism (``--dp-size 2``), in real SGLang on CPU.

SGLang's data-parallel controller starts one scheduler per replica, each
with its own worker and so its own trie, and dispatches requests between
them round robin. Each replica must speculate on its own share of the load
and answer as plain decoding does. SGLang binds each CPU rank to its own
cores (``SGLANG_CPU_OMP_THREADS_BIND``), one core per replica here.

An external corpus added over HTTP (``/add_external_corpus``) must reach
every replica: each one loads it and answers for it, and requests then draft
from it on whichever replica serves them.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import urllib.request

import pytest

from cpu_env import cpu_server_args
from lookahead.validate.server import SGLangServer

PROMPTS = [f"def function_{i}(x):\n    return x + {i}\n" * (2 + i % 3) for i in range(8)]
# Questions whose answers (recorded by the plain server) become a corpus.
QUESTIONS = ["How do I reset the device to its factory settings? Answer:",
             "What does the blinking red light on the router mean? Answer:"]


def _post(url: str, body: dict, method: str = "POST") -> dict:
    req = urllib.request.Request(url, None if method == "GET" else json.dumps(body).encode(),
                                 {"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def _generate(url: str, prompt, salt: str | None = None, corpora=None) -> dict:
    params = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    if corpora is not None:
        params["custom_params"] = {"lookahead_corpora": corpora}
    body = {("text" if isinstance(prompt, str) else "input_ids"): prompt, "sampling_params": params}
    if salt:
        body["cache_salt"] = salt
    return _post(url + "/generate", body)


def _serve(model: str, args: list, env: dict, log, then) -> dict:
    srv = SGLangServer(model, args, env, log)
    srv.start(timeout=600)
    try:
        # All at once: the controller splits them between the replicas, four
        # each, within LOOKAHEAD's default max batch size.
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(lambda p: _generate(srv.url, p), PROMPTS))
        more = then(srv.url)
    finally:
        srv.stop()
    return {"answers": answers, "log": log.read_text(errors="replace"), **more}


def _corpus_round(url: str, questions: list, answers: list) -> dict:
    """Add the recorded answers as a corpus, list it, then ask each question
    of two users in a row (two replicas, round robin) with the corpus and
    without it (``custom_params``: no corpus); each user has its own
    ``cache_salt``, so no history can help."""
    chunks = [q[-8:] + a for q, a in zip(questions, answers)]
    added = _post(url + "/add_external_corpus", {"corpus_id": "answers", "token_chunks": chunks})
    listed = _post(url + "/list_external_corpora", {}, method="GET")
    asked = {"with": [], "without": []}
    for how, corpora in (("with", None), ("without", [])):
        for i, q in enumerate(questions):
            for user in range(2):
                asked[how].append(_generate(url, q, f"{how}-{i}-{user}", corpora))
    return {"added": added, "listed": listed, "asked": asked}


@pytest.fixture(scope="module")
def runs(tiny_model, cpu_subprocess_env, tmp_path_factory):
    from transformers import AutoTokenizer

    questions = [AutoTokenizer.from_pretrained(tiny_model)(q)["input_ids"] for q in QUESTIONS]
    logs = tmp_path_factory.mktemp("dp")
    plain = _serve(tiny_model, cpu_server_args(disable_overlap_schedule=True, max_running_requests=8),
                   cpu_subprocess_env, logs / "plain.log",
                   lambda url: {"recorded": [_generate(url, q)["output_ids"] for q in questions]})
    lookahead = _serve(
        tiny_model,
        cpu_server_args(max_running_requests=8) + [
            "--dp-size", "2", "--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", "4"],
        {**cpu_subprocess_env, "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}, logs / "lookahead_dp2.log",
        lambda url: _corpus_round(url, questions, plain["recorded"]))
    return plain, lookahead


def test_every_replica_runs_lookahead(runs):
    _, lookahead = runs
    for rank in ("DP0", "DP1"):
        assert re.search(rf"{rank}\] LOOKAHEAD worker: verify width 4", lookahead["log"]), rank
    assert "Traceback" not in lookahead["log"], lookahead["log"][-4000:]


def test_answers_identical_to_plain_decoding(runs):
    plain, lookahead = runs
    assert [a["output_ids"] for a in lookahead["answers"]] == [a["output_ids"] for a in plain["answers"]]


def test_the_replicas_speculate(runs):
    _, lookahead = runs
    metas = [a["meta_info"] for a in lookahead["answers"]]
    # Every request was verified with drafts, and the repetitive prompts' drafts were accepted.
    assert all(m["spec_verify_ct"] > 0 for m in metas), metas
    assert sum(m["completion_tokens"] for m in metas) > 1.3 * sum(m["spec_verify_ct"] for m in metas), metas


def test_every_replica_gets_an_added_corpus(runs):
    """SGLang fans the add out to every scheduler and joins their answers
    with " | ": one "Loaded" per replica, with the same count; the list
    likewise."""
    plain, lookahead = runs
    added, listed = lookahead["added"], lookahead["listed"]
    tokens = sum(8 + len(a) for a in plain["recorded"])
    assert added["success"] is True and added["loaded_token_count"] == tokens, added
    parts = added["message"].split(" | ")
    assert len(parts) == 2 and all(f"Loaded corpus 'answers' with {tokens} tokens" in p for p in parts), added
    assert listed["success"] is True and listed["corpus_token_counts"] == {"answers": tokens}, listed
    assert listed["message"].count("answers") == 2, listed


def test_requests_on_both_replicas_draft_from_the_corpus(runs):
    """Each question asked by two users in a row (one per replica): with the
    corpus every answer is drafted from it, at least twice the acceptance of
    the same request without it, and identical to plain decoding."""
    plain, lookahead = runs
    asked = lookahead["asked"]
    expected = [a for a in plain["recorded"] for _ in range(2)]
    assert [o["output_ids"] for o in asked["with"]] == expected
    assert [o["output_ids"] for o in asked["without"]] == expected
    with_al = [o["meta_info"]["spec_accept_length"] for o in asked["with"]]
    without_al = [o["meta_info"]["spec_accept_length"] for o in asked["without"]]
    print(f"acceptance length with the corpus {with_al}, without {without_al}")
    assert all(w >= 2 * wo for w, wo in zip(with_al, without_al)), (with_al, without_al)
