"""The SGLang features a user combines with LOOKAHEAD, as HTTP requests.

``run_matrix(url, cases)`` sends every case to one running server and
returns what each case's answer is made of (token ids, texts, logprobs,
finish reasons), so that the answers of a plain server and of LOOKAHEAD
servers can be compared case by case (``tests/e2e/test_feature_matrix.py``).

The cases are built from a probe of the plain server (``build_cases``):
the stop token and stop string are taken from what the model really writes,
so that the stop falls in the middle of a run of drafted tokens.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

GREEDY = {"temperature": 0.0, "max_new_tokens": 40}
# Logprobs agree to float32 precision. A verify computes them in an
# extend-shaped forward and a plain step in a decode-shaped one, so sums run
# in another order: up to 1.2e-4 apart on the tiny model in CI. Any real fault
# (a context token wrong, dropped or misplaced) moves them by over 1 nat there.
# tests/unit/test_logprob_tolerance.py measures both; docs/history.md the CI runs.
LOGPROB_TOLERANCE = 1e-3
# The cases whose answers must equal plain decoding's.
COMPARED = [
    "greedy", "regex", "json_schema", "ebnf", "openai_response_format",
    "logprobs_bs1", "logprobs_bs4", "logprobs_bs6", "logprobs_start_len", "token_ids_logprob",
    "openai_chat_logprobs", "openai_completion_logprobs",
    "n_2", "stop_string", "stop_regex", "stop_token_ids", "min_new_tokens", "max_new_tokens_1", "max_new_tokens_2",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "penalties_combined",
    "custom_logit_processor", "long_prompt", "concurrent_16",
]
PROMPTS = [
    "def add(a, b):\n    return",
    "the cat the cat the cat the cat",
    "import os\nimport sys\nimport os\nimport sys\n",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,",
    "Hello world. Hello world. Hello",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(",
    "SELECT name FROM users WHERE id = 1;\nSELECT name FROM",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
]
# Bounded so that an answer ends within its token budget (every token is at least a character).
REGEX = r"([a-z]{1,8} ){2,8}[a-z]{1,8}\."
SHORT_REGEX = r"([a-z]{1,5} ){1,4}[a-z]{1,5}\."
JSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "count": {"type": "integer", "minimum": 0, "maximum": 999},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
    "required": ["name", "count", "tags"],
}
EBNF = 'root ::= "SELECT " name " FROM " name ";"\nname ::= [a-z] [a-z]? [a-z]? [a-z]? [a-z]? [a-z]?'


def post(url: str, payload: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return json.loads(body) if body.strip() else {}


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


def stream(url: str, payload: dict, on_chunk=None, timeout: float = 300) -> list:
    """The ``data:`` chunks of a streamed ``/generate``, decoded."""
    req = urllib.request.Request(url, data=json.dumps({**payload, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            chunks.append(chunk)
            if on_chunk is not None and on_chunk(chunk):
                break
    return chunks


def _gen(text: str, **sampling) -> dict:
    return {"text": text, "sampling_params": {**GREEDY, **sampling}}


def _answer(out: dict) -> dict:
    """What a /generate answer is compared by."""
    meta = out["meta_info"]
    rec = {"output_ids": out.get("output_ids"), "text": out["text"],
           "finish_reason": meta["finish_reason"], "completion_tokens": meta["completion_tokens"]}
    for key in ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "output_token_ids_logprobs"):
        if meta.get(key) is not None:
            rec[key] = meta[key]
    return rec


def build_cases(probe: list, probe_text: str) -> dict:
    """Every case of the matrix; ``probe`` is the plain server's greedy output
    ids for ``PROMPTS[0]`` (48 tokens, EOS ignored), ``probe_text`` its greedy
    text for ``PROMPTS[7]``."""
    stop_token = probe[9]
    early = probe[3]
    # A stop string taken from the model's own text, mid-output; the same cut
    # by a stop regex (SGLang matches it on the decoded tail).
    stop_str = probe_text[len(probe_text) // 2: len(probe_text) // 2 + 3]
    stop_regex = re.escape(stop_str[:2]) + r"[\s\S]"
    cases = {
        "stop_string": [_gen(PROMPTS[7], stop=[stop_str])],
        "stop_regex": [_gen(PROMPTS[7], stop_regex=stop_regex)],
        # structured output
        "regex": [_gen(PROMPTS[0], regex=REGEX, max_new_tokens=96), _gen(PROMPTS[3], regex=REGEX, max_new_tokens=96)],
        "json_schema": [_gen(PROMPTS[1], json_schema=json.dumps(JSON_SCHEMA), max_new_tokens=128)],
        "ebnf": [_gen(PROMPTS[6], ebnf=EBNF, max_new_tokens=32)],
        # stops and lengths: the stop token is written in the middle of a run
        "stop_token_ids": [_gen(PROMPTS[0], stop_token_ids=[stop_token], max_new_tokens=48)],
        "min_new_tokens": [_gen(PROMPTS[0], min_new_tokens=12, stop_token_ids=[early], max_new_tokens=48),
                           _gen(PROMPTS[0], min_new_tokens=5, stop_token_ids=[early, stop_token])],
        "max_new_tokens_1": [_gen(PROMPTS[2], max_new_tokens=1, ignore_eos=True)],
        "max_new_tokens_2": [_gen(PROMPTS[2], max_new_tokens=2, ignore_eos=True)],
        "n_2": [{"text": PROMPTS[4], "sampling_params": {**GREEDY, "n": 2, "ignore_eos": True}}],
        # penalties: every tree node must see its own path's counts
        "greedy": [_gen(p, ignore_eos=True) for p in PROMPTS[:3]],
        # (Values that keep penalised logits clear of ties: plain decoding
        # itself breaks a near tie either way as batching changes its floats.)
        "frequency_penalty": [_gen(p, frequency_penalty=0.61, ignore_eos=True) for p in PROMPTS[:3]],
        "presence_penalty": [_gen(p, presence_penalty=0.83, ignore_eos=True) for p in PROMPTS[:3]],
        "repetition_penalty": [_gen(p, repetition_penalty=1.37, ignore_eos=True) for p in PROMPTS[:3]],
        "penalties_combined": [_gen(PROMPTS[1], frequency_penalty=0.29, presence_penalty=0.37,
                                    repetition_penalty=1.17, min_new_tokens=8, stop_token_ids=[early])],
        # A custom logit processor forbids a token plain greedy decoding writes;
        # the request beside it shares its batch.
        "custom_logit_processor": [
            {**_gen(PROMPTS[0], ignore_eos=True, custom_params={"token_ids": [probe[6]]}),
             "custom_logit_processor": _disallow_tokens()},
            _gen(PROMPTS[1], ignore_eos=True)],
        # logprobs
        "logprobs_start_len": [{**_gen(PROMPTS[5], ignore_eos=True), "return_logprob": True,
                                "logprob_start_len": 0, "top_logprobs_num": 2}],
    }
    # logprobs at batch sizes 1, 4 and 6 (6 is above the max batch size: the fallback)
    for bs in (1, 4, 6):
        cases[f"logprobs_bs{bs}"] = [{**_gen(PROMPTS[i], ignore_eos=True), "return_logprob": True,
                                      "top_logprobs_num": 3} for i in range(bs)]
    # logprobs of chosen token ids, at batch size 6
    cases["token_ids_logprob"] = [{**_gen(PROMPTS[i], ignore_eos=True), "return_logprob": True,
                                   "token_ids_logprob": [stop_token, early]} for i in range(6)]
    return cases


def _disallow_tokens() -> str:
    """SGLang's own example processor, serialised as a request carries it
    (the servers run with ``--enable-custom-logit-processor``)."""
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    return DisallowedTokensLogitsProcessor().to_str()


def _concurrent(url: str, payloads: list) -> list:
    with ThreadPoolExecutor(max_workers=len(payloads)) as pool:
        return list(pool.map(lambda p: post(url + "/generate", p), payloads))


# With margins: the top logprobs every answer of the reference also returns.
MARGIN_TOP = 2
_LOGPROB_FIELDS = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs",
                   "output_token_ids_logprobs")


def _with_margins(payload: dict) -> tuple[dict, tuple]:
    """``payload`` asking for the top logprobs of every output token too, and
    the answer fields that adds (to be moved out of the answer)."""
    if payload.get("top_logprobs_num"):
        return payload, ()
    if payload.get("return_logprob"):
        return {**payload, "top_logprobs_num": MARGIN_TOP}, ("output_top_logprobs",)
    return {**payload, "return_logprob": True, "top_logprobs_num": MARGIN_TOP}, _LOGPROB_FIELDS


def _margin(answer: dict, added: tuple) -> dict:
    """Move the fields ``added`` from ``answer`` into its margin record: the
    answer keeps what the unaugmented request returns."""
    margin = {"output_top_logprobs": answer.get("output_top_logprobs")}
    for key in added:
        answer.pop(key, None)
    return margin


def _generate_case(url: str, payloads: list, margins: Optional[list] = None, metas: Optional[list] = None) -> list:
    """The answers to ``payloads`` (sent together); with ``margins`` (a list to
    fill), each answer's top logprobs are collected there, answer by answer,
    and with ``metas`` each answer's ``meta_info``."""
    added = [()] * len(payloads)
    if margins is not None:
        payloads, added = zip(*map(_with_margins, payloads))
    outs = _concurrent(url, payloads) if len(payloads) > 1 else [post(url + "/generate", payloads[0])]
    answers = []
    for out, extra in zip(outs, added):
        for o in out if isinstance(out, list) else [out]:
            answers.append(_answer(o))
            if metas is not None:
                metas.append(o["meta_info"])
            if margins is not None:
                margins.append(_margin(answers[-1], extra))
    return answers


def long_prompt(n_lines: int = 120) -> str:
    return "".join(f"value_{i} = compute({i}, {i * 7 % 13})\n" for i in range(n_lines))


def reference(url: str, model: str) -> tuple[dict, dict]:
    """The cases, built from a probe of this (plain) server's own greedy
    output, and its answers to them: what every other server is compared with."""
    cases, results, _ = reference_with_margins(url, model, margins=False)
    return cases, results


def reference_with_margins(url: str, model: str, margins: bool = True) -> tuple[dict, dict, Optional[dict]]:
    """``reference``, and (``margins``) the top logprobs of every token the
    reference wrote, asked for alongside each answer and kept apart from it
    (``numerics.compare`` reads them to tell a near tie from a wrong token)."""
    probe = post(url + "/generate", _gen(PROMPTS[0], max_new_tokens=48, ignore_eos=True))
    probe_text = post(url + "/generate", _gen(PROMPTS[7], ignore_eos=True))["text"]
    cases = build_cases(probe["output_ids"], probe_text)
    kept = {} if margins else None
    return cases, run_matrix(url, cases, model, margins=kept), kept


def run_matrix(url: str, cases: dict, model: str, margins: Optional[dict] = None) -> dict:
    """Send every case to the server at ``url``; returns case name -> answers.
    With ``margins`` (a dict to fill), every compared answer's top logprobs
    are collected there under the answer's own place (``reference_with_margins``)."""
    def case_margins(name):
        return None if margins is None else margins.setdefault(name, [])

    def answer(name, payload, metas=None):
        return _generate_case(url, [payload], case_margins(name), metas)[0]

    results = {name: _generate_case(url, payloads, case_margins(name)) for name, payloads in cases.items()}

    # Sampled grammar requests (on CPU: LOOKAHEAD's sampling verification
    # under the grammar mask). The regex is short enough to end within the budget.
    sampled = [post(url + "/generate", _gen(p, regex=SHORT_REGEX, temperature=0.9, top_p=0.95, max_new_tokens=64))
               for p in PROMPTS[:4]]
    results["regex_sampled_valid"] = all(re.fullmatch(SHORT_REGEX, o["text"]) for o in sampled)

    # OpenAI endpoints: a JSON-schema response format, and logprobs.
    chat = post(url + "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Describe a point as JSON."}],
        "temperature": 0, "max_tokens": 128,
        "response_format": {"type": "json_schema", "json_schema": {"name": "thing", "schema": JSON_SCHEMA}},
        **({"logprobs": True, "top_logprobs": MARGIN_TOP} if margins is not None else {}),
    })
    results["openai_response_format"] = chat["choices"][0]["message"]["content"]
    if margins is not None:
        margins["openai_response_format"] = _chat_tokens(chat)
    chat_lp = post(url + "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": PROMPTS[2]}],
        "temperature": 0, "max_tokens": 24, "logprobs": True, "top_logprobs": 2,
    })
    results["openai_chat_logprobs"] = _chat_tokens(chat_lp)
    comp = post(url + "/v1/completions", {
        "model": model, "prompt": PROMPTS[5], "temperature": 0, "max_tokens": 24, "logprobs": 2,
        "stop": None,
    })
    results["openai_completion_logprobs"] = [comp["choices"][0]["text"],
                                             comp["choices"][0]["logprobs"]["token_logprobs"]]
    if margins is not None:
        lp = comp["choices"][0]["logprobs"]
        margins["openai_completion_logprobs"] = [
            (token, logprob, sorted(tops.items(), key=lambda kv: -kv[1]) if tops else [])
            for token, logprob, tops in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])]

    # A prompt longer than --chunked-prefill-size, then the same one again
    # (its prefix now comes from the radix cache).
    text = long_prompt()
    metas = []
    results["long_prompt"] = [answer("long_prompt", _gen(text, ignore_eos=True), metas) for _ in range(2)]
    results["radix_cache_hit"] = metas[1].get("cached_tokens", 0) > 0

    # Streaming reassembles to the non-streaming answer (each chunk carries
    # the answer so far; it grows by whole verify steps).
    chunks = stream(url + "/generate", _gen(PROMPTS[1], ignore_eos=True))
    whole = post(url + "/generate", _gen(PROMPTS[1], ignore_eos=True))
    results["stream"] = {"chunks": len(chunks), "text": chunks[-1]["text"], "streamed_ids": chunks[-1]["output_ids"],
                         "prefixes": all(whole["text"].startswith(c["text"]) for c in chunks),
                         "whole": whole["text"], "output_ids": whole["output_ids"]}

    # Abort mid-stream; the server keeps serving, losslessly.
    results["abort"] = _abort_mid_stream(url)

    # 16 concurrent requests of mixed lengths: the batch grows past the max
    # batch size and shrinks below it again.
    mixed = [_gen(PROMPTS[i % len(PROMPTS)] + f" # {i}", max_new_tokens=8 + 7 * (i % 8), ignore_eos=True)
             for i in range(16)]
    results["concurrent_16"] = _generate_case(url, mixed, case_margins("concurrent_16"))
    return results


def _chat_tokens(chat: dict) -> list:
    """(token, logprob, top logprobs) of each token of an OpenAI chat answer."""
    return [(t["token"], t["logprob"], [(x["token"], x["logprob"]) for x in t["top_logprobs"]])
            for t in chat["choices"][0]["logprobs"]["content"]]


def _abort_mid_stream(url: str) -> dict:
    seen = []

    def enough(chunk):
        seen.append(chunk)
        if len(seen) == 3:
            post(url + "/abort_request", {"rid": "matrix-abort"})
        return False

    error = None
    try:
        stream(url + "/generate", {"rid": "matrix-abort", "text": PROMPTS[2],
                                   "sampling_params": {**GREEDY, "max_new_tokens": 3000, "ignore_eos": True}},
               on_chunk=enough)
    except (urllib.error.URLError, ConnectionError, OSError) as exc:
        error = repr(exc)
    last = seen[-1]["meta_info"] if seen else {}
    after = post(url + "/generate", _gen(PROMPTS[3], ignore_eos=True))
    return {"chunks": len(seen), "error": error,
            "finish_reason": (last.get("finish_reason") or {}).get("type"),
            "completion_tokens": last.get("completion_tokens"),
            "after": _answer(after), "healthy": _health(url)}


def _health(url: str) -> bool:
    for _ in range(10):
        try:
            get(url + "/health")
            return True
        except (urllib.error.URLError, OSError):
            time.sleep(1.0)
    return False



def differences(expected, got, where: str = "answer", tolerance: float = LOGPROB_TOLERANCE) -> list:
    """Where two answers differ; floats (logprobs) within ``tolerance``."""
    if isinstance(expected, float) or isinstance(got, float):
        if expected is None or got is None or not abs(expected - got) <= tolerance:  # NaN differs
            return [f"{where}: {expected!r} != {got!r}"]
        return []
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return [f"{where}: {str(expected)[:200]} != {str(got)[:200]}"]
        return [d for i, (e, g) in enumerate(zip(expected, got)) for d in differences(e, g, f"{where}[{i}]", tolerance)]
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            return [f"{where}: keys {sorted(expected)} != {sorted(got) if isinstance(got, dict) else got!r}"]
        return [d for k in expected for d in differences(expected[k], got[k], f"{where}.{k}", tolerance)]
    return [] if expected == got else [f"{where}: {str(expected)[:200]} != {str(got)[:200]}"]
