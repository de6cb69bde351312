"""External corpora in the trie (``lookahead.trie.corpora``, ``LookaheadCache.add_corpus``):
drafting from them, scopes, a request's choice, the budget, loads and removals,
persistence, the file readers, and agreement with the reference model."""

from __future__ import annotations

import json
import random
import threading
import time

import numpy as np
import pytest

from trie_helpers import check_draft, open_cache  # noqa: F401  (sets sys.path)
from trie_reference import RefCache

from lookahead import LookaheadCache, LookaheadConfig
from lookahead.trie._tuning import DraftTuning
from lookahead.trie.corpora import (
    SGLANG_SEPARATOR, CorpusError, CorpusOverBudget, CorpusRemoved, ReadReport, piece_bytes, piece_sizes,
    read_corpus,
)

ANSWER = list(range(500, 800))  # a "recorded answer": in the corpus, never in a prompt
QUESTION = [1, 2, 3, 4, 5, 6]


def _prompt_then(n: int) -> list:
    # A prompt whose end is the answer's first n tokens (the request has started answering).
    return QUESTION + ANSWER[:n]


def test_a_corpus_drafts_its_continuation():
    with open_cache(background=False) as cache:
        assert cache.add_corpus("manual", [ANSWER]) == len(ANSWER)
        cache.put_prompt("r", _prompt_then(10))
        d = cache.draft("r", _prompt_then(10), 7)
        assert d.tokens == ANSWER[10:17]
        # Without it, nothing.
        cache.remove_corpus("manual")
        assert cache.draft("r", _prompt_then(10), 7).tokens == []
        assert cache.corpora() == {}


def test_an_unpublished_corpus_is_drafted_from_once_published():
    # Tensor parallelism adds corpora with publish=False: loaded, listed, but
    # read by drafts only from publish_corpus on (every rank at the same step).
    with open_cache(background=False) as cache:
        assert cache.add_corpus("manual", [ANSWER], publish=False) == len(ANSWER)
        assert cache.corpora()["manual"]["state"] == "ready" and not cache.corpora()["manual"]["published"]
        cache.put_prompt("r", _prompt_then(10))
        assert cache.draft("r", _prompt_then(10), 7).tokens == []
        cache.publish_corpus("manual")
        assert cache.draft("r", _prompt_then(10), 7).tokens == ANSWER[10:17]
        with pytest.raises(CorpusError, match="not found"):
            cache.publish_corpus("other")


def test_a_corpus_competes_with_the_history_on_the_same_footing():
    # The same context in the history and in a corpus, with different
    # continuations: the tree holds both; a corpus that does not match costs nothing.
    with open_cache(background=False) as cache:
        cache.put_prompt("a", [9, 9, 9, 10, 11, 12])
        cache.put_output("a", [40, 41, 42, 43])
        cache.finish("a")
        cache.synchronize()
        cache.add_corpus("c", [[10, 11, 12, 50, 51, 52, 53]])
        cache.put_prompt("b", [10, 11, 12])
        d = cache.draft("b", [10, 11, 12], 8)
        assert {40, 50} <= set(d.tokens)
        cache.add_corpus("unrelated", [list(range(1000, 1300))])
        assert cache.draft("b", [10, 11, 12], 8) == d


def test_a_scoped_corpus_is_never_drafted_to_another_scope():
    secret = list(range(2000, 2300))
    with open_cache(background=False) as cache:
        cache.add_corpus("tenant-a", [secret], scope="cache_salt:a")
        cache.add_corpus("public", [ANSWER])
        rng = random.Random(0)
        for i, (scope, share) in enumerate([(None, True), ("cache_salt:b", True), ("extra_key:a", True),
                                            (None, False), ("cache_salt:a", True)]):
            for j in range(20):
                start = rng.randrange(0, 250)
                ctx = QUESTION + secret[start:start + rng.randrange(1, 30)]
                rid = f"r{i}-{j}"
                cache.put_prompt(rid, ctx, scope=scope, share=share)
                d = cache.draft(rid, ctx, 7)
                if scope == "cache_salt:a":
                    assert d.tokens[:3] == secret[start + len(ctx) - len(QUESTION):][:3] or not d.tokens
                    assert d.tokens, "the scope's own corpus drafts"
                else:
                    # Only the prompt's own tokens (copied from it) may appear, never the rest of the secret.
                    assert not set(d.tokens) - set(ctx), (scope, share, d)
                # The public corpus is drafted to every request, private ones included.
                pub = _prompt_then(5)
                cache.put_prompt(rid + "p", pub, scope=scope, share=share)
                assert cache.draft(rid + "p", pub, 5).tokens == ANSWER[5:10]


def test_a_requests_choice_restricts_its_corpora():
    other = list(range(900, 1200))
    with open_cache(background=False) as cache:
        cache.add_corpus("answers", [ANSWER])
        cache.add_corpus("other", [QUESTION + other])
        cache.add_corpus("mine", [ANSWER], scope="cache_salt:x")
        for choice, scope, want in [
            (None, None, ANSWER[10:15]),
            (["answers"], None, ANSWER[10:15]),
            ("answers", None, ANSWER[10:15]),
            (["other"], None, []),
            ([], None, []),
            (["nonexistent"], None, []),
            (["mine"], None, []),            # a scoped corpus named from another scope: still not visible
            (["mine"], "cache_salt:x", ANSWER[10:15]),
        ]:
            rid = f"{choice}-{scope}"
            cache.put_prompt(rid, _prompt_then(10), scope=scope, corpora=choice)
            assert cache.draft(rid, _prompt_then(10), 5).tokens == want, (choice, scope)
        # The choice restricts corpora, not the request's own scope's history.
        cache.put_prompt("h", [70, 71, 72])
        cache.put_output("h", [73, 74, 75, 76])
        cache.finish("h")
        cache.synchronize()
        cache.put_prompt("q", [70, 71, 72], corpora=[])
        assert cache.draft("q", [70, 71, 72], 4).tokens == [73, 74, 75, 76]


def test_remove_during_load_stops_it():
    n = 3_000_000
    tokens = np.random.default_rng(0).integers(0, 30_000, n, dtype=np.int32)
    with open_cache() as cache:
        future = cache.add_corpus("big", [tokens], background=True)
        assert cache.corpora()["big"]["state"] == "loading"
        cache.remove_corpus("big")
        with pytest.raises(CorpusRemoved, match="removed while it loaded"):
            future.result(timeout=60)
        assert "big" not in cache.corpora()
        assert cache.stats()["corpus_bytes"] == 0
        # The id is free again, and a second removal says there is none.
        with pytest.raises(CorpusError, match="not found"):
            cache.remove_corpus("big")
        assert cache.add_corpus("big", [ANSWER]) == len(ANSWER)


def test_add_of_an_existing_id_and_bad_input_are_refused():
    with open_cache(background=False, vocab_size=1000) as cache:
        cache.add_corpus("c", [ANSWER])
        with pytest.raises(CorpusError, match="already exists"):
            cache.add_corpus("c", [QUESTION])
        assert cache.corpora()["c"]["tokens"] == len(ANSWER)  # unchanged
        for bad, match in [([[1, 2, 1000]], "outside the vocabulary"), ([[1, -5]], "outside the vocabulary"),
                           ([["a", "b"]], "integer token ids"), (5, "list of token id lists"),
                           ([[[1, 2], [3, 4]]], "flat list")]:
            with pytest.raises(CorpusError, match=match):
                cache.add_corpus("d", bad)
        with pytest.raises(CorpusError, match="corpus_id"):
            cache.add_corpus("", [ANSWER])
        with pytest.raises(TypeError):
            cache.add_corpus("e", [ANSWER], scope=5)
        assert set(cache.corpora()) == {"c"}


def test_an_empty_corpus_is_added_with_no_tokens():
    with open_cache(background=False) as cache:
        assert cache.add_corpus("empty", []) == 0
        assert cache.add_corpus("empty2", [[], [SGLANG_SEPARATOR]]) == 0
        assert cache.corpora()["empty"] == {"tokens": 0, "bytes": 0, "scope": None, "state": "ready", "loaded": 0,
                                            "published": True}
        cache.put_prompt("r", QUESTION)
        assert cache.draft("r", QUESTION, 4).tokens == []
        cache.remove_corpus("empty")


def test_sglang_chunks_are_one_stream_with_separators():
    # SGLang's NGRAM sends fixed-size chunks of one stream, documents split by -2**31.
    with open_cache(background=False) as cache:
        doc1, doc2 = [11, 12, 13, 14, 15], [11, 12, 13, 20, 21]
        chunks = [doc1[:3], doc1[3:] + [SGLANG_SEPARATOR] + doc2[:1], doc2[1:]]
        assert cache.add_corpus("c", chunks) == 11
        cache.put_prompt("r", [13, 14])
        assert cache.draft("r", [13, 14], 3, one_branch=True).tokens == [15]  # a document ends there
        cache.put_prompt("s", [11, 12])
        assert set(cache.draft("s", [11, 12], 6).tokens) >= {13, 14, 20}


def test_the_budget_is_kept_and_a_corpus_beyond_it_is_refused_whole():
    with open_cache(background=False, corpus_memory_bytes=1 << 20) as cache:
        cache.add_corpus("a", [list(range(20_000))])
        used = cache.stats()["corpus_bytes"]
        assert 0 < used <= 1 << 20
        with pytest.raises(CorpusOverBudget, match=r"needs [\d,]+ bytes.*has [\d,]+ of 1,048,576 bytes left"):
            cache.add_corpus("b", [list(range(20_000))])
        assert set(cache.corpora()) == {"a"}
        cache.remove_corpus("a")
        cache.add_corpus("b", [list(range(20_000))])


def test_piece_sizes_waste_little():
    for n in [1, 1000, 5000, 70_000, 1 << 20, (1 << 20) + 1, 10_000_000]:
        sizes = piece_sizes(n)
        assert all(s & (s - 1) == 0 for s in sizes) and sum(sizes) >= n
        assert sum(sizes) <= max(1024, n * 1.26), (n, sizes)
    assert piece_sizes(10_000_000) == [1 << 23, 1 << 21]


def test_a_ten_million_token_corpus_stays_within_its_budget():
    n = 10_000_000
    tokens = np.random.default_rng(1).integers(0, 50_000, n, dtype=np.int32)
    budget = 320 << 20
    with open_cache(corpus_memory_bytes=budget) as cache:
        t0 = time.perf_counter()
        assert cache.add_corpus("big", [tokens]) == n
        seconds = time.perf_counter() - t0
        stats = cache.stats()
        assert stats["corpus_tokens"] == n
        held = sum(s.nbytes for s in cache._corpora._corpora["big"].stores)
        # Charged as loaded (linked chains); frozen, the pieces hold no more.
        assert stats["corpus_bytes"] == sum(piece_bytes(c, 4) for c in piece_sizes(n)) <= budget
        assert held <= stats["corpus_bytes"]
        cache.put_prompt("r", tokens[5_000_000:5_000_040])
        assert cache.draft("r", tokens[5_000_000:5_000_040], 7).tokens[:3] == tokens[5_000_040:5_000_043].tolist()
        print(f"10M-token corpus: {held / 2**20:.0f} MiB, indexed in {seconds:.1f} s")


def test_concurrent_add_remove_and_draft():
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 64, 20_000, dtype=np.int32) for _ in range(4)]
    stop = threading.Event()
    errors = []
    with open_cache() as cache:
        def churn(k):
            i = 0
            while not stop.is_set():
                cid = f"c{k}-{i % 3}"
                try:
                    f = cache.add_corpus(cid, [docs[(k + i) % 4]], scope=None if i % 2 else "cache_salt:s",
                                         background=bool(i % 3))
                    if i % 4 == 0:
                        cache.remove_corpus(cid)
                    if hasattr(f, "result"):
                        try:
                            f.result()
                        except CorpusRemoved:
                            pass
                    if cid in cache.corpora():
                        cache.remove_corpus(cid)
                except CorpusError as exc:
                    if "already exists" not in str(exc) and "not found" not in str(exc):
                        errors.append(exc)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                i += 1

        def draft(k):
            j = 0
            while not stop.is_set():
                rid = (k, j)
                ctx = docs[j % 4][j % 1000: j % 1000 + 30]
                try:
                    cache.put_prompt(rid, ctx[:5], scope="cache_salt:s" if j % 2 else None, corpora=None if j % 3 else [f"c0-{j % 3}"])
                    for d in cache.batch_draft([rid], [ctx], 7) + [cache.draft(rid, ctx, 7, one_branch=True)]:
                        check_draft(d, 7, False)
                        assert set(d.tokens) <= set(range(64))
                    cache.finish(rid)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                j += 1

        threads = [threading.Thread(target=churn, args=(k,)) for k in range(2)] + \
                  [threading.Thread(target=draft, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        time.sleep(3)
        stop.set()
        for t in threads:
            t.join(60)
        assert not errors, errors[:3]


def test_corpora_are_saved_and_loaded_with_their_scopes(tmp_path):
    path = tmp_path / "trie.npz"
    with open_cache(background=False) as cache:
        cache.add_corpus("pub", [ANSWER])
        cache.add_corpus("a", [list(range(2000, 2100)), [SGLANG_SEPARATOR], [7, 8, 9]], scope="cache_salt:a")
        cache.add_corpus("empty", [])
        before = cache.corpora()
        cache.save(path)
    loaded = LookaheadCache.open(path)
    try:
        assert loaded.corpora() == before
        loaded.put_prompt("r", _prompt_then(10))
        assert loaded.draft("r", _prompt_then(10), 5).tokens == ANSWER[10:15]
        loaded.put_prompt("s", [2000, 2001], scope="cache_salt:a")
        assert loaded.draft("s", [2000, 2001], 3, one_branch=True).tokens == [2002, 2003, 2004]
        loaded.put_prompt("t", [2000, 2001], scope="cache_salt:b")
        assert loaded.draft("t", [2000, 2001], 3).tokens == []
    finally:
        loaded.close()
    # A saved corpus beyond a smaller budget now is skipped with a warning; the rest loads.
    small = LookaheadCache.open(path, corpus_memory_bytes=64 << 10)
    try:
        assert set(small.corpora()) <= {"pub", "a", "empty"}
    finally:
        small.close()


def test_damaged_corpus_entries_set_the_file_aside(tmp_path):
    path = tmp_path / "trie.npz"
    with open_cache(background=False) as cache:
        cache.add_corpus("pub", [ANSWER])
        cache.save(path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["corpus_lengths"] = np.asarray([5], np.int64)  # does not match the tokens
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    cache = LookaheadCache.open(path)
    try:
        assert cache.corpora() == {}
        assert (tmp_path / "trie.npz.corrupt").exists()
    finally:
        cache.close()


# Short walks and few candidates: the history and the corpora then share
# what is left of each order's walk (see _gather in _matching.pyx).
SHORT_WALKS = DraftTuning(max_walk=3, low_walk=5, top_walk=4, enough_candidates=4, max_candidates=24)


@pytest.mark.parametrize("tuning", [DraftTuning(), SHORT_WALKS], ids=["default", "short_walks"])
@pytest.mark.parametrize("seed", range(6))
def test_drafts_with_corpora_match_the_reference(seed, tuning):
    rng = random.Random(seed)
    vocab = rng.choice([6, 8, 12])
    cfg = LookaheadConfig(max_memory_bytes=1 << 16, background=False)
    ref = RefCache(cfg, tuning)
    scopes = [None, "cache_salt:a", "cache_salt:b"]
    with open_cache(cfg, tuning) as cache:
        for i in range(rng.randrange(1, 4)):
            stream = [rng.randrange(vocab) if rng.random() > 0.05 else -1 for _ in range(rng.choice([30, 300, 3000]))]
            scope = rng.choice(scopes + [None])
            cache.add_corpus(f"c{i}", [stream], scope)
            ref.add_corpus(f"c{i}", _normalized(stream), scope)
        compared = 0
        for r in range(40):
            scope, share = rng.choice(scopes), rng.random() > 0.2
            choice = None if rng.random() < 0.6 else [f"c{j}" for j in range(3) if rng.random() < 0.5]
            prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
            cache.put_prompt(r, prompt, scope=scope, share=share, corpora=choice)
            ref.put_prompt(r, prompt, scope, share, choice)
            for _ in range(3):
                out = [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
                cache.put_output(r, out)
                ref.put_output(r, out)
                prompt += out
                budget, one_branch = rng.randrange(1, 10), rng.random() < 0.3
                cache.synchronize()
                d = cache.draft(r, prompt, budget, one_branch)
                want = ref.draft(r, prompt, budget, one_branch)
                assert (d.tokens, d.parents) == want[:2], (r, d, want)
                compared += bool(d.tokens)
            if rng.random() < 0.7:
                cache.finish(r)
                ref.finish(r)
            if rng.random() < 0.05 and ref.corpora:
                cid = rng.choice(sorted(ref.corpora))
                cache.remove_corpus(cid)
                ref.remove_corpus(cid)
        assert compared > 10


def _normalized(stream):
    # What the cache stores: leading separators dropped.
    out = list(stream)
    while out and out[0] == -1:
        out.pop(0)
    return out


# -- readers -------------------------------------------------------------------------


class _Tok:
    def encode(self, text):
        return [ord(c) % 256 for c in text]


def test_read_sglang_jsonl_of_strings(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join([json.dumps("hello"), "", json.dumps("world"), "{not json", json.dumps(5),
                            json.dumps({"text": "abc"}), json.dumps({"input_ids": [1, 2, 3]}),
                            json.dumps({"input_ids": [1, -2]}), json.dumps({"other": 1}), json.dumps("")]))
    report = ReadReport()
    chunks = read_corpus(str(p), _Tok().encode, 255, report)
    assert chunks == [[ord(c) for c in "hello"], [SGLANG_SEPARATOR], [ord(c) for c in "world"], [SGLANG_SEPARATOR],
                      [97, 98, 99], [SGLANG_SEPARATOR], [1, 2, 3]]
    assert report.documents == 4
    assert report.skipped == {"lines that are not JSON": 1,
                              'lines that are not a string, {"text"} or {"input_ids"}': 1,
                              "input_ids lines that are not lists of ids >= 0": 1,
                              'lines without a "text" string or "input_ids" list': 1,
                              "empty documents": 1}
    assert "skipped" in str(report)


def test_read_a_directory_of_text_files(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("def f(): pass\n")
    (tmp_path / "README").write_text("read me")
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\0\0")
    (tmp_path / "blob").write_bytes(b"\0\1\2")
    (tmp_path / "empty.txt").write_text("  ")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("secret")
    report = ReadReport()
    chunks = read_corpus(str(tmp_path), _Tok().encode, 255, report)
    docs = [c for c in chunks if c != [SGLANG_SEPARATOR]]
    assert sorted("".join(map(chr, d)) for d in docs) == ["def f(): pass\n", "read me"]
    assert report.skipped == {"binary or non-text files": 2, "empty files": 1}


def test_read_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a file nor a directory"):
        read_corpus(str(tmp_path / "missing.jsonl"), _Tok().encode, 255)
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"input_ids": [1, 300]}) + "\n" + json.dumps("x"))
    report = ReadReport()
    assert read_corpus(str(p), None if False else _Tok().encode, 255, report) == [[ord("x")]]
    assert report.skipped == {"documents with ids outside the vocabulary": 1}
    with pytest.raises(ValueError, match="no tokenizer"):
        read_corpus(str(p), None, 1000)


def test_replay_measures_a_corpus(tmp_path, capsys):
    from lookahead.replay import main

    rng = random.Random(0)
    answers = [[rng.randrange(100, 5000) for _ in range(80)] for _ in range(5)]
    corpus, trace = tmp_path / "corpus.jsonl", tmp_path / "trace.jsonl"
    corpus.write_text("".join(json.dumps({"input_ids": [1, 2, 3] + a}) + "\n" for a in answers))
    trace.write_text("".join(json.dumps({"prompt": [7, 8, 1, 2, 3], "response": answers[i % 5]}) + "\n"
                             for i in range(10)))
    assert main(["--trace", str(trace), "--corpus", str(corpus), "--drafters", "lookahead", "--no-plot",
                 "--quiet", "--out-dir", str(tmp_path / "out")]) == 0
    rows = {r["drafter"] + (f" ({r['split']})" if r.get("split") else ""): r
            for r in json.loads((tmp_path / "out" / "replay.json").read_text())}
    out = capsys.readouterr().out
    assert "lookahead (corpus)" in out and "corpus " + str(corpus) + ": 5 documents" in out
    with_corpus = [r for k, r in rows.items() if "corpus" in k][0]
    without = [r for k, r in rows.items() if "corpus" not in k][0]
    assert with_corpus["acceptance_length"] >= 2 * without["acceptance_length"], (with_corpus, without)


@pytest.mark.parametrize("seed", range(4))
def test_a_frozen_store_drafts_as_it_did_linked(seed):
    # freeze() lays the chains out as arrays: the same occurrences in the
    # same order, so the same drafts, hash collisions included (few slots).
    from lookahead.trie._drafting import Drafter
    from lookahead.trie._store import TokenStore
    from lookahead.trie.cache import Draft

    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([5, 50, 5000]))
    stream = rng.integers(0, vocab, 6000).astype(np.int32)
    stream[rng.random(6000) < 0.03] = -1
    orders = (1, 2, 4, 8)
    linked, frozen = (TokenStore(8192, True, orders) for _ in range(2))
    for s in (linked, frozen):
        s.append_indexed(stream)
    assert frozen.freeze() and frozen.frozen and not linked.frozen
    config = DraftTuning(max_walk=5, low_walk=9, enough_candidates=6).native(32)
    drafter = Drafter(Draft)
    for _ in range(300):
        end = int(rng.integers(1, len(stream)))
        ctx = stream[max(0, end - 40):end]
        ctx = ctx[ctx >= 0] if rng.random() < 0.5 else rng.integers(0, vocab, 12).astype(np.int32)
        if not len(ctx):
            continue
        budget, one_branch = int(rng.integers(1, 12)), bool(rng.random() < 0.3)
        want = drafter.draft_context(None, linked, ctx, budget, one_branch, config, 2**31 - 1)
        got = drafter.draft_context(None, frozen, ctx, budget, one_branch, config, 2**31 - 1)
        assert got == want
    assert frozen.nbytes <= linked.nbytes + 4 * len(orders)
    with pytest.raises(ValueError, match="frozen"):
        frozen.append_indexed(stream[:10])
    # A store that is not a fully indexed, unwrapped ring is left as it is.
    grown = TokenStore(64, False, orders)
    grown.append_indexed(stream[:100])
    assert not grown.freeze() and not grown.frozen


def test_a_loaded_corpus_is_frozen():
    with open_cache(background=False) as cache:
        cache.add_corpus("manual", [ANSWER])
        stores = cache._corpora.view["manual"][1]
        assert stores and all(s.frozen for s in stores)
