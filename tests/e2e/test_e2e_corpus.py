"""External corpora on a real ``python -m sglang.launch_server --speculative-algorithm LOOKAHEAD`` on CPU.

One server (tiny model, ``--admin-api-key``) serves every test here. It is
started with ``--speculative-lookahead-corpus``: a JSONL file holding a
recorded answer (the model's own greedy continuation of a question, taken
with Hugging Face ``generate``, which is plain decoding) among distractors,
in the three line formats the flag reads. The first request asks that
question and drafts the answer from the corpus; a request that chooses no
corpus (``custom_params``) is the same request without it. Then SGLang's own
corpus endpoints: add, a request, list, remove, with NGRAM's bodies and
status codes, the admin key, and bad bodies answered with HTTP 400.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from cpu_env import cpu_server_args
from lookahead.validate.server import SGLangServer

ADMIN_KEY = "corpus-admin-secret"
QUESTION = "How do I reset the device to its factory settings? Answer:"
ANSWER_TOKENS = 48


def _request(url: str, payload=None, *, key: str | None = ADMIN_KEY, method: str = "POST",
             raw: bytes | None = None, timeout: float = 300) -> tuple[int, dict]:
    data = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
            return r.status, (json.loads(body) if body.strip() else {})
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            return err.code, json.loads(body)
        except ValueError:
            return err.code, {"raw": body.decode(errors="replace")}


def _generate(base: str, ids: list, salt: str, corpora=None, n: int = ANSWER_TOKENS) -> dict:
    params = {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}
    if corpora is not None:
        params["custom_params"] = {"lookahead_corpora": corpora}
    status, out = _request(base + "/generate", {"input_ids": ids, "sampling_params": params, "cache_salt": salt})
    assert status == 200, out
    return out


@pytest.fixture(scope="module")
def recorded(tiny_model):
    """The question's ids and the model's greedy answer (plain decoding, Hugging Face)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    ids = tok(QUESTION)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=ANSWER_TOKENS, do_sample=False)
    return {"question": ids, "answer": out[0, len(ids):].tolist(), "tokenizer": tok}


@pytest.fixture(scope="module")
def server(tiny_model, cpu_subprocess_env, recorded, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus_server")
    corpus = tmp / "helpdesk.jsonl"
    with open(corpus, "w") as f:
        f.write(json.dumps("The printer needs a new toner cartridge when the light blinks.") + "\n")
        f.write(json.dumps({"text": "To change the password, open the settings and choose security."}) + "\n")
        # The recorded answer behind the end of its question.
        f.write(json.dumps({"input_ids": recorded["question"][-8:] + recorded["answer"]}) + "\n")
        f.write("{not json\n")  # counted and skipped, never a crash
    args = cpu_server_args(max_running_requests=4, max_total_tokens=8192) + [
        "--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", "8",
        "--speculative-lookahead-corpus", str(corpus), "--admin-api-key", ADMIN_KEY, "--log-level", "info",
    ]
    srv = SGLangServer(tiny_model, args, cpu_subprocess_env, tmp / "server.log")
    srv.start(timeout=600)
    srv.corpus_id = str(corpus)
    yield srv
    srv.stop()


def test_a_startup_corpus_drafts_on_the_first_request(server, recorded):
    # The first request of the server: only the corpus can know the answer.
    with_corpus = _generate(server.url, recorded["question"], "user-1")
    without = _generate(server.url, recorded["question"], "user-2", corpora=[])
    assert with_corpus["output_ids"] == without["output_ids"] == recorded["answer"]
    al_with = with_corpus["meta_info"]["spec_accept_length"]
    al_without = without["meta_info"]["spec_accept_length"]
    print(f"acceptance length with the corpus {al_with:.2f}, without {al_without:.2f}")
    assert al_with >= 2 * al_without, (al_with, al_without)
    assert "loaded the corpus" in server.log_tail(200_000)
    assert "1 lines that are not JSON" in server.log_tail(200_000)


def test_add_request_list_remove_as_ngram(server, recorded):
    tok = recorded["tokenizer"]
    text = "Warranty claims are answered within five working days by the service team."
    status, body = _request(server.url + "/add_external_corpus", {"corpus_id": "warranty", "documents": [text]})
    assert status == 200, body
    assert body["success"] is True and body["corpus_id"] == "warranty"
    assert body["loaded_token_count"] == len(tok(text, add_special_tokens=False)["input_ids"])
    assert set(body) == {"success", "corpus_id", "message", "loaded_token_count"}
    # A scoped corpus, from token chunks.
    status, body = _request(server.url + "/add_external_corpus",
                            {"corpus_id": "tenant", "token_chunks": [[5, 6, 7, 8, 9, 10]], "scope": "cache_salt:t"})
    assert status == 200 and body["loaded_token_count"] == 6, body
    # The id is taken now.
    status, body = _request(server.url + "/add_external_corpus", {"corpus_id": "warranty", "documents": ["x"]})
    assert status == 400 and body["success"] is False and "already exists" in body["message"], body
    # A request that starts the sentence gets the rest from the corpus.
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out = _generate(server.url, ids[:6], "user-3", n=16)
    assert out["meta_info"]["spec_verify_ct"] > 0
    status, body = _request(server.url + "/list_external_corpora", method="GET")
    assert status == 200 and body["success"] is True, body
    assert set(body) == {"success", "corpus_token_counts", "message"}
    assert body["corpus_token_counts"]["warranty"] == len(ids)
    assert body["corpus_token_counts"]["tenant"] == 6
    assert server.corpus_id in body["corpus_token_counts"]
    assert "scope cache_salt:t" in body["message"] and "bytes" in body["message"], body
    status, body = _request(server.url + "/remove_external_corpus", {"corpus_id": "warranty"})
    assert status == 200 and body == {"success": True, "message": "Removed corpus 'warranty'."}, body
    status, body = _request(server.url + "/remove_external_corpus", {"corpus_id": "warranty"})
    assert status == 400 and body["success"] is False and "not found" in body["message"], body
    status, body = _request(server.url + "/list_external_corpora", method="GET")
    assert "warranty" not in body["corpus_token_counts"]


def test_a_wrong_admin_key_is_refused(server):
    for key in (None, "wrong"):
        status, _ = _request(server.url + "/add_external_corpus", {"corpus_id": "x", "documents": ["y"]}, key=key)
        assert status in (401, 403), status
        status, _ = _request(server.url + "/list_external_corpora", method="GET", key=key)
        assert status in (401, 403), status
    status, body = _request(server.url + "/list_external_corpora", method="GET")
    assert "x" not in body["corpus_token_counts"]


@pytest.mark.parametrize("payload", [
    {"corpus_id": "bad", "bogus_field": 1},
    {"corpus_id": "bad", "documents": 5},
    {"corpus_id": "bad", "token_chunks": [[1, 2, 10 ** 9]]},
    {"corpus_id": "bad", "token_chunks": "abc"},
    {"corpus_id": "bad", "file_path": "/nonexistent/corpus.jsonl"},
    {"corpus_id": "bad", "documents": ["a"], "scope": 7},
    {"corpus_id": "bad"},
])
def test_a_malformed_body_gets_400_and_the_server_keeps_serving(server, recorded, payload):
    status, body = _request(server.url + "/add_external_corpus", payload)
    assert status == 400 and body["success"] is False and body["message"], (payload, status, body)
    out = _generate(server.url, recorded["question"], "user-4", n=4)
    assert len(out["output_ids"]) == 4
    status, body = _request(server.url + "/list_external_corpora", method="GET")
    assert "bad" not in body["corpus_token_counts"]
