"""``python -m lookahead.replay`` end to end, and its helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

from lookahead.replay import accepted_length, make_drafter, replay  # noqa: E402
from lookahead.replay.baselines import tree_from_mask  # noqa: E402


def test_accepted_length_hand_cases():
    truth = np.array([5, 6, 7, 8])
    assert accepted_length([], [], truth) == 0
    assert accepted_length([5, 6, 7], [-1, 0, 1], truth) == 3
    assert accepted_length([5, 6, 9], [-1, 0, 1], truth) == 2
    assert accepted_length([4, 6, 7], [-1, 0, 1], truth) == 0
    # A chain longer than the truth stops at its end.
    assert accepted_length([5, 6, 7, 8, 9], [-1, 0, 1, 2, 3], truth) == 4
    assert accepted_length([5, 6], [-1, 0], np.array([], np.int32)) == 0
    # Branches: the matching sibling is followed, whichever comes first.
    #   root -> 4 -> 6 ; root -> 5 -> 9 ; 5 -> 6 -> 7
    tokens, parents = [4, 5, 6, 9, 6, 7], [-1, -1, 0, 1, 1, 4]
    assert accepted_length(tokens, parents, truth) == 3
    assert accepted_length(tokens, parents, np.array([4, 6, 1])) == 2
    assert accepted_length(tokens, parents, np.array([5, 9, 9])) == 2
    assert accepted_length(tokens, parents, np.array([6])) == 0


def test_tree_from_mask_hand_cases():
    # NGRAM's output: the root (last context token) then width-1 drafts; row i
    # of the mask marks node i and its ancestors.
    chain_ids = np.array([100, 1, 2, 3])
    chain_mask = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)
    assert tree_from_mask(chain_ids, chain_mask.ravel(), 4) == ([1, 2, 3], [-1, 0, 1])
    # root -> 1 -> 3 ; root -> 2 -> 4 ; 1 -> 5
    ids = np.array([100, 1, 2, 3, 4, 5])
    mask = np.zeros((6, 6), dtype=np.int32)
    for node, ancestors in {0: [], 1: [0], 2: [0], 3: [0, 1], 4: [0, 2], 5: [0, 1]}.items():
        mask[node, ancestors + [node]] = 1
    assert tree_from_mask(ids, mask.ravel(), 6) == ([1, 2, 3, 4, 5], [-1, -1, 0, 1, 0])
    # Padding nodes hang off the root and are kept (SGLang verifies them too).
    pad_ids = np.array([100, 7, 0, 0])
    pad_mask = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]])
    assert tree_from_mask(pad_ids, pad_mask.ravel(), 4) == ([7, 0, 0], [-1, -1, -1])


def _write_trace(path: Path, pairs) -> None:
    with open(path, "w") as f:
        for prompt, response in pairs:
            f.write(json.dumps({"prompt": [int(t) for t in prompt], "response": [int(t) for t in response]}) + "\n")


def _copy_heavy_pairs(n: int = 12, seed: int = 0):
    """Edit-style requests: the response is the prompt's document with a few
    small edits, and the documents are mostly made of a few recurring 8-token
    blocks, so short n-grams are ambiguous while long matches are not."""
    rng = np.random.default_rng(seed)
    blocks = [rng.integers(0, 400, size=8) for _ in range(8)]
    pairs = []
    for _ in range(n):
        doc = np.concatenate([blocks[i] if rng.random() < 0.9 else rng.integers(0, 400, size=8)
                              for i in rng.integers(0, len(blocks), size=45)])
        edited = doc.copy()
        for pos in rng.integers(0, len(doc), size=3):
            edited[pos] = rng.integers(400, 500)
        instruction = rng.integers(500, 600, size=10)
        pairs.append((np.concatenate([instruction, doc]).astype(np.int32), edited.astype(np.int32)))
    return pairs


def test_lookahead_beats_prompt_lookup_on_copy_heavy_trace():
    pairs = _copy_heavy_pairs()
    results = {name: replay(make_drafter(name, 8), pairs, 8, "copy").acceptance_length
               for name in ("lookahead", "lookahead-1b", "prompt-lookup")}
    # Prompt lookup copies after the *earliest* occurrence of a short suffix;
    # LOOKAHEAD weighs every occurrence by how long it matches.
    assert results["lookahead"] > 1.05 * results["prompt-lookup"] > 1.05, results
    assert results["lookahead-1b"] > 1.05 * results["prompt-lookup"], results


def test_replay_cli_runs_all_drafters(tmp_path):
    trace = tmp_path / "tiny.jsonl"
    _write_trace(trace, _copy_heavy_pairs(n=4, seed=1))
    out_dir = tmp_path / "out"
    env = dict(os.environ)
    # SGLang's NGRAM compiles its C++ on first use; keep the build in the repo's (ignored) cache.
    env.setdefault("SGLANG_JIT_CACHE_DIR", str(REPO / ".cache" / "sglang_jit"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-m", "lookahead.replay", "--trace", str(trace), "--budget", "2", "4",
                           "--out-dir", str(out_dir)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| tiny |")]
    drafters = {row.split("|")[3].strip() for row in rows}
    assert {"lookahead", "lookahead-1b", "ngram", "prompt-lookup"} <= drafters, proc.stdout
    assert len(rows) == 2 * len(drafters)
    for row in rows:
        al = float(row.split("|")[4])
        assert 1.0 <= al <= 5.0, row  # at most budget + 1 tokens per step
    results = json.loads((out_dir / "replay.json").read_text())
    assert {(r["drafter"], r["budget"]) for r in results} == {(d, b) for d in drafters for b in (2, 4)}
    png = (out_dir / "replay.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    if "suffix" not in drafters:
        assert "arctic_inference is not installed" in proc.stdout
