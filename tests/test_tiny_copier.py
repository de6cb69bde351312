"""The tiny copier checkpoint (``lookahead/testing/tiny_copier``) and its training script.

What is pinned here, without starting SGLang (``test_e2e_copier.py`` serves it):
the checkpoint is a Llama of at most 20M parameters that ``scripts/train_tiny_copier.py``
made (its frozen circuit is exactly what the script builds), the script's
compact training forward is the exported model, and the checkpoint copies
held-out code (teacher-forced) almost without error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import copier_tasks as tasks  # noqa: E402
import train_tiny_copier as train  # noqa: E402
from lookahead.testing import TINY_COPIER  # noqa: E402

COPIER = TINY_COPIER


@pytest.fixture(scope="module")
def weights() -> dict:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(COPIER / "model.safetensors")).items()}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(COPIER))


def test_checkpoint_is_a_small_llama(weights):
    config = json.loads((COPIER / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert sum(t.numel() for t in weights.values()) <= 20_000_000
    assert config["num_hidden_layers"] == train.LAYERS
    assert (COPIER / "model.safetensors").stat().st_size < 40 * 2**20


def test_tokenizer_adds_the_sink_and_ends_answers(tokenizer):
    ids = tokenizer("def f():")["input_ids"]
    assert ids[0] == train.BOS_ID  # the copy head's sink
    assert tokenizer.eos_token_id == train.END_ID
    assert len(tokenizer) == train.VOCAB_SIZE


def test_frozen_circuit_is_what_the_script_builds(weights):
    circuit = train.build_circuit(torch.Generator().manual_seed(train.SEED))
    for name, tensor in circuit.items():
        if name == "model.embed_tokens.weight":  # its last columns are learned
            tensor, got = tensor[:, : train.LM.start], weights[name][:, : train.LM.start]
        else:
            got = weights[name]
        assert torch.equal(tensor.to(torch.bfloat16).float(), got), name


def test_training_forward_is_the_exported_model():
    gen = torch.Generator().manual_seed(1)
    model = train.Trainable(train.build_circuit(gen), gen)
    ids = torch.randint(7, train.VOCAB_SIZE, (2, 96), generator=gen)
    ids[:, 0] = train.BOS_ID
    with torch.no_grad():
        compact = model(ids)
        full = train.forward({k: v.detach() for k, v in model.weights().items()}, ids)
    assert torch.allclose(compact, full, atol=1e-3)


def test_copies_held_out_code_teacher_forced(weights, tokenizer):
    """Given the answer so far, the next token is the pasted code's, past the code fence.

    Rename requests on held-out modules; the new name's tokens are left out of the
    count (the model copies the old name: renames are not learned, docs/copier.md)."""
    errors = total = 0
    fence = len(tokenizer("```python\n", add_special_tokens=False)["input_ids"])
    for case in tasks.held_out_requests(tokenizer, 6, kinds=("edit",)):
        new = case["prompt"].split("` to `", 1)[1].split("`", 1)[0]
        renamed = {tokenizer.convert_tokens_to_ids(t) for t in tokenizer.tokenize(new) + tokenizer.tokenize(" " + new)}
        prompt = tokenizer(case["prompt"])["input_ids"]
        answer = tokenizer(case["expected"], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            predicted = train.forward(weights, ids)[0].argmax(-1)
        for t in range(len(prompt) + fence - 1, len(prompt) + len(answer) - 1):
            if int(ids[0, t + 1]) in renamed:
                continue
            errors += int(predicted[t] != ids[0, t + 1])
            total += 1
    assert total > 500
    assert errors / total < 0.01, f"{errors} of {total} copied tokens wrong"


def test_held_out_files_never_train():
    trained = {p.resolve() for p in tasks.training_files()}
    held = [p.resolve() for p in tasks.held_out_files()]
    assert len(held) >= 15
    assert not trained & set(held)


def test_training_script_runs_and_exports_a_loadable_model(tmp_path):
    """A few steps end to end: tokenizer, circuit, training, export."""
    from transformers import AutoTokenizer

    out = tmp_path / "copier"
    assert train.main(["--minutes", "0.02", "--out", str(out), "--batch-tokens", "1024"]) == 0
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok("x")["input_ids"][0] == train.BOS_ID
