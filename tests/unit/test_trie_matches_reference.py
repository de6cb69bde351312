"""Native drafts equal the reference model's (``trie_reference.py``), call for call.

Random call sequences under random options and tuning (hypothesis), and
replays built to reach eviction, hash collisions, rehashing, the native
cap on candidates and real token ids; plus structural invariants of drafts
on inputs too large for the reference.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead import LookaheadConfig  # noqa: E402
from draft_paths import check_paths_in_history  # noqa: E402
from trie_reference import RefCache  # noqa: E402
from trie_helpers import (  # noqa: E402
    PROPERTY_SETTINGS, SMALL_MEMORY, as_input, check_draft, configure, open_cache, replay_against_reference,
)


# sampled_from draws uniformly; st.integers would favour the smallest values.
RANDOM_CONFIG = st.fixed_dictionaries({
    "max_memory_bytes": st.sampled_from([1 << 16, 1 << 18, 1 << 20]),
    "orders": st.sampled_from([(1, 2, 3, 4, 6, 8), (1, 2, 3), (2, 4), (1,), (1, 3, 5, 7), (3, 5, 8)]),
    "max_match_len": st.sampled_from([1, 2, 3, 5, 8, 32, 40]),
    "max_walk": st.sampled_from([1, 2, 3, 5, 24, 30]),
    "max_candidates": st.sampled_from([1, 2, 3, 10, 48, 64, 300]),  # 300: above the native cap of 256
    "enough_candidates": st.sampled_from([1, 2, 4, 8, 16, 24]),
    "match_exponent": st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0]),
    "local_weight": st.sampled_from([0.5, 1.0, 4.0]),
    "chain_local_weight": st.sampled_from([0.5, 4.0, 6.0]),
    "copy_boost": st.sampled_from([0.0, 0.5, 4.0]),
    "wildcard_tokens": st.sampled_from([0, 1, 2, 3]),
    "mismatch_weight": st.sampled_from([0.0, 0.5, 1.0]),
    "wildcard_weight": st.sampled_from([0.0, 0.05, 1.0]),
    "wildcard_pace": st.sampled_from([0.0, 2.5, 4.0]),
    "wildcard_walk": st.sampled_from([1, 4, 16]),
    "wildcard_below": st.sampled_from([0.0, 3.0, 30.0, float("inf")]),
    "output_weight": st.sampled_from([0.5, 1.0, 2.0]),
    "min_match_len": st.sampled_from([1, 1, 2, 3, 4]),
    "confidence": st.sampled_from([0.0, 1.0, 8.0]),
    "order_norm": st.sampled_from([0.0, 0.5, 1.0]),
    "min_score": st.sampled_from([0.0, 0.0, 0.05, 0.3]),
    "anchor_pace": st.sampled_from([0.0, 2.0, 3.0]),
    "share_outputs": st.sampled_from([True, True, False]),
    "share_prompt_tail": st.sampled_from([0, 1, 3, 8, 10]),
    "share_tail_margin": st.sampled_from([0, 1, 3, 16]),
    "flush_tokens": st.sampled_from([1, 3, 8, 128]),
    "remember_answers": st.sampled_from([0, 1, 2, 8192]),
    "background": st.booleans(),
})

DEFAULT_CONFIG = st.fixed_dictionaries({
    "max_memory_bytes": st.sampled_from([1 << 16, 1 << 20]),
    "background": st.booleans(),
})


def run_against_reference(data, config_kwargs: dict, max_ops: int = 40) -> int:
    """Drive the cache and the reference with the same random calls, each
    request in one of a few scopes; every draft (taken after
    ``synchronize()``) must be identical, and come from the request's own
    stream and its scope's only.  Returns the number of non-empty drafts
    compared."""
    cfg, tuning = configure(**config_kwargs)
    vocab = data.draw(st.sampled_from([5, 6, 7, 8]), label="vocab")
    tok = st.integers(0, vocab - 1)
    kinds = st.sampled_from(["list", "tuple", "int32", "int64"])
    ref = RefCache(cfg, tuning)
    live: dict = {}  # rid -> stream (prompt + outputs)
    scope_of: dict = {}  # rid -> its scope's name ("private": it shares nothing)
    histories: dict = {}  # scope -> every stream ever fed in it
    prompts: list = []  # every prompt drawn, to serve again
    next_rid = 0
    nonempty = 0
    with open_cache(cfg, tuning) as cache:
        for _ in range(data.draw(st.sampled_from([3, max_ops // 2, max_ops]), label="ops")):
            choices = ["prompt"] + (["output", "output", "finish", "draft", "draft", "batch"] if live else [])
            action = data.draw(st.sampled_from(choices))
            if action == "prompt":
                rid = next_rid if next_rid % 2 else f"req-{next_rid}"
                next_rid += 1
                if prompts and data.draw(st.booleans(), label="asked again"):
                    prompt = data.draw(st.sampled_from(prompts))  # served before: its answer is remembered
                else:
                    size = data.draw(st.sampled_from([0, 3, 10, 25, 40]))
                    prompt = data.draw(st.lists(tok, min_size=size, max_size=max(size, 40)), label="prompt")
                    prompts.append(prompt)
                name = data.draw(st.sampled_from(["default", "default", "a", "b", "private"]), label="scope")
                scope, share = (None if name in ("default", "private") else name), name != "private"
                cache.put_prompt(rid, as_input(prompt, data.draw(kinds)), scope=scope, share=share)
                ref.put_prompt(rid, prompt, scope, share)
                live[rid] = list(prompt)
                scope_of[rid] = name
                histories.setdefault(name, []).append(live[rid])
            elif action == "output":
                rid = data.draw(st.sampled_from(sorted(live, key=str)))
                size = data.draw(st.sampled_from([1, 2, 3, 10, 20]))
                out = data.draw(st.lists(tok, min_size=size, max_size=size))
                cache.put_output(rid, as_input(out, data.draw(kinds)))
                ref.put_output(rid, out)
                live[rid].extend(out)
            elif action == "finish":
                rid = data.draw(st.sampled_from(sorted(live, key=str)))
                cache.finish(rid)
                ref.finish(rid)
                del live[rid]
            else:
                budget = data.draw(st.sampled_from(range(13)), label="budget")
                one_branch = data.draw(st.booleans(), label="one_branch")
                ordered = sorted(live, key=str)
                rids = ordered if action == "batch" else [data.draw(st.sampled_from(ordered))]
                contexts = []
                for rid in rids:
                    how = data.draw(st.sampled_from(["stream", "stream", "stream+", "prefix", "random"]))
                    stream = live[rid]
                    if how == "stream":
                        ctx = list(stream)
                    elif how == "stream+":
                        ctx = stream + data.draw(st.lists(tok, min_size=1, max_size=3))
                    elif how == "prefix":
                        ctx = stream[: data.draw(st.integers(0, len(stream)))]
                    else:
                        ctx = data.draw(st.lists(tok, min_size=1, max_size=12))
                    contexts.append(ctx)
                cache.synchronize()
                if action == "batch":
                    got = cache.batch_draft(rids, [as_input(c, data.draw(kinds)) for c in contexts], budget, one_branch)
                else:
                    got = [cache.draft(rids[0], as_input(contexts[0], data.draw(kinds)), budget, one_branch=one_branch)]
                for rid, ctx, d in zip(rids, contexts, got):
                    want = ref.draft(rid, ctx, budget, one_branch)
                    assert (d.tokens, d.parents) == want[:2], (
                        f"draft for {rid!r} after {ctx} (budget {budget}, one_branch {one_branch}) "
                        f"differs from the reference: {d} != {want}")
                    assert math.isclose(d.expected, want[2], rel_tol=1e-9, abs_tol=1e-12), (d, want)
                    assert 0.0 <= d.expected <= len(d.tokens)
                    check_draft(d, budget, one_branch)
                    if ctx:
                        # Only from its own stream and its scope's (isolation).
                        name = scope_of[rid]
                        seen = [live[rid]] if name == "private" else histories[name]
                        check_paths_in_history(d, ctx, seen, max(tuning.wildcard_tokens, int(tuning.wildcard_weight > 0)))
                    nonempty += bool(d.tokens)
    return nonempty


@settings(max_examples=150, **PROPERTY_SETTINGS)
@given(data=st.data(), config=DEFAULT_CONFIG)
def test_matches_reference_default_config(data, config):
    run_against_reference(data, config)


@settings(max_examples=300, **PROPERTY_SETTINGS)
@given(data=st.data(), config=RANDOM_CONFIG)
def test_matches_reference_random_config(data, config):
    run_against_reference(data, config)


def test_reference_with_eviction_and_collisions():
    """A small shared ring (half as many hash slots) fed ~10x its capacity from a
    tiny vocabulary: eviction, partly evicted n-grams and hash collisions all
    occur, and the drafts still equal the reference's."""
    rng = random.Random(7)
    requests = []
    cfg = LookaheadConfig(max_memory_bytes=SMALL_MEMORY, flush_tokens=16)
    for _ in range(40 * cfg.shared_capacity // 1024):
        prompt = [rng.randrange(6) for _ in range(rng.randint(0, 40))]
        response = [rng.randrange(6) for _ in range(rng.randint(20, 300))]
        requests.append((prompt, response))
    nonempty, seen = replay_against_reference(cfg, requests, seed=1, draft_every=3)
    assert seen > 8 * cfg.shared_capacity
    assert nonempty > 100


def test_reference_with_long_outputs_rehash():
    """A request whose store grows far past its first capacity (re-hashed twice)."""
    rng = random.Random(3)
    prompt = [rng.randrange(50) for _ in range(30)]
    response = []
    while len(response) < 9000:  # repetitive, like code: copy earlier spans
        if response and rng.random() < 0.6:
            start = rng.randrange(len(response))
            response.extend(response[start: start + rng.randint(2, 12)])
        else:
            response.append(rng.randrange(50))
    cfg = LookaheadConfig(max_memory_bytes=1 << 20)
    nonempty, _ = replay_against_reference(cfg, [(prompt, response[:9000])], seed=5, draft_every=7)
    assert nonempty > 100


def test_reference_with_many_candidates():
    """Walks long enough to gather more occurrences than the native scratch
    holds (max_candidates is capped at 256)."""
    rng = random.Random(9)
    requests = [([rng.randrange(3) for _ in range(300)], [rng.randrange(3) for _ in range(120)]) for _ in range(4)]
    cfg, tuning = configure(max_memory_bytes=1 << 18, max_walk=400, max_candidates=1000, enough_candidates=1000,
                            flush_tokens=32)
    nonempty, _ = replay_against_reference(cfg, requests, seed=2, draft_every=3, tuning=tuning)
    assert nonempty > 60


def _code_pairs(tokenizer_json: str, limit: int = 12, max_response: int = 120) -> list:
    """HumanEval-shaped ``(prompt, response)`` pairs of real token ids: the
    standard library's functions with a docstring, the signature and
    docstring as the prompt and the body (its first ``max_response`` tokens)
    as the response, tokenized by a real LLM tokenizer."""
    import argparse
    import ast
    import difflib
    import inspect
    import shlex
    import textwrap

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    pairs = []
    for module in (textwrap, shlex, difflib, argparse):
        source = inspect.getsource(module)
        lines = source.splitlines(keepends=True)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and len(node.body) > 1:
                docstring_end = node.body[0].end_lineno
                prompt = tokenizer.encode("".join(lines[node.lineno - 1: docstring_end])).ids
                body = tokenizer.encode("".join(lines[docstring_end: node.end_lineno])).ids[:max_response]
                pairs.append((prompt, body))
                if len(pairs) == limit:
                    return pairs
    return pairs


def test_reference_on_real_tokens(real_model):
    """Real token ids (Python source through SmolLM2's tokenizer, as the
    tests' real model has it) through the default drafting knobs."""
    pairs = _code_pairs(str(Path(real_model) / "tokenizer.json"))
    assert len(pairs) == 12 and max(max(p + r) for p, r in pairs) > 10_000  # ids beyond a toy vocabulary
    nonempty, _ = replay_against_reference(LookaheadConfig(max_memory_bytes=1 << 20), pairs, seed=11, draft_every=2)
    assert nonempty > 50


def test_reference_on_the_humaneval_trace():
    """The humaneval replay trace's token ids. The traces live outside the
    repository: ``LOOKAHEAD_TRACES`` names their folder."""
    folder = os.environ.get("LOOKAHEAD_TRACES")
    path = Path(folder or ".") / "humaneval.jsonl.gz"
    if not folder or not path.exists():
        pytest.skip(f"no humaneval.jsonl.gz in LOOKAHEAD_TRACES ({folder!r}): set it to the replay traces' folder "
                    "(test_reference_on_real_tokens covers real token ids without it)")
    from lookahead.replay import load_trace

    pairs = load_trace(str(path), limit=12)
    nonempty, _ = replay_against_reference(LookaheadConfig(max_memory_bytes=1 << 20), pairs, seed=11, draft_every=2)
    assert nonempty > 50


@settings(max_examples=25, **PROPERTY_SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.sampled_from([8, 50, 1000]), one_branch=st.booleans(),
       budget=st.integers(0, 24))
def test_structure_on_larger_inputs(seed, vocab, one_branch, budget):
    """Larger random histories (many requests, outputs copying earlier spans):
    drafts are well-formed trees within budget, and every path was fed."""
    rng = random.Random(seed)
    history = []
    with open_cache(max_memory_bytes=1 << 18, flush_tokens=32) as cache:
        for rid in range(12):
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 400))]
            cache.put_prompt(rid, prompt)
            stream = list(prompt)
            history.append(stream)
            for step in range(rng.randint(5, 60)):
                if stream and rng.random() < 0.7:
                    start = rng.randrange(len(stream))
                    out = stream[start: start + rng.randint(1, 3)]
                else:
                    out = [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
                cache.put_output(rid, out)
                stream.extend(out)
                if step % 5 == 0:
                    cache.synchronize()
                    d = cache.draft(rid, stream, budget, one_branch)
                    check_draft(d, budget, one_branch)
                    check_paths_in_history(d, stream, history)
            if rng.random() < 0.7:
                cache.finish(rid)
        cache.synchronize()
        assert cache.stats()["failed_inserts"] == 0
