"""The offline tiny-model builder: reproducible, idempotent, loadable by HF.

Building takes ~10 s on a quiet machine; the module builds two seeds once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from tiny_model import MODEL_CONFIG, build_tiny_model


def _digest(path: Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.iterdir())
        if f.is_file()
    }


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "a": Path(build_tiny_model(root / "a", seed=0)),
        "b": Path(build_tiny_model(root / "b", seed=0)),
        "other_seed": Path(build_tiny_model(root / "c", seed=1)),
    }


def test_deterministic_and_idempotent(builds):
    a, b = builds["a"], builds["b"]
    assert _digest(a) == _digest(b)
    before = {f.name: f.stat().st_mtime_ns for f in a.iterdir()}
    assert build_tiny_model(a, seed=0) == str(a)
    assert {f.name: f.stat().st_mtime_ns for f in a.iterdir()} == before
    assert _digest(builds["other_seed"])["model.safetensors"] != _digest(a)["model.safetensors"]
    assert _digest(builds["other_seed"])["tokenizer.json"] == _digest(a)["tokenizer.json"]
    assert not [p for p in a.parent.iterdir() if p.name.startswith(".")], "temp dir left behind"


def test_config_and_tokenizer(builds):
    from transformers import AutoConfig, AutoTokenizer

    path = builds["a"]
    config = AutoConfig.from_pretrained(path)
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 128, 2048)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.max_position_embeddings >= 8192

    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == MODEL_CONFIG["vocab_size"]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    text = "def f(x):\n    return x + 1  # ünïcode"
    assert tok.decode(tok(text).input_ids) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|bos|><|user|>\nhi<|end|>\n<|assistant|>\n"
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == tok.bos_token_id


def test_hf_generate_is_self_consistent(builds):
    """Greedy generate() is reproducible and matches a manual argmax loop."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    path = builds["a"]
    tok = AutoTokenizer.from_pretrained(path)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok("import os\nimport sys\n", return_tensors="pt").input_ids
    kwargs = dict(max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    first = model.generate(ids, **kwargs)
    assert torch.equal(first, model.generate(ids, **kwargs))

    seq = ids
    with torch.no_grad():
        for _ in range(24):
            nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(seq, first)
    # Random weights still loop soon: the tail repeats earlier bigrams.
    gen = first[0, ids.shape[1]:].tolist()
    bigrams = list(zip(gen, gen[1:]))
    assert len(set(bigrams)) < len(bigrams)


def test_recipe_stamp_written(builds):
    stamp = json.loads((builds["a"] / "tiny_model_recipe.json").read_text())
    assert stamp["seed"] == 0 and stamp["model_config"]["hidden_size"] == 128
