"""Build a tiny random Llama checkpoint plus a local BPE tokenizer, offline.

Tests, benchmarks and the demo need a real Hugging Face model directory that
sglang can load, but this project must never download weights. A 2-layer Llama
with random weights is enough to exercise the whole serving path (prefill,
decode, tree verification); its greedy output soon loops, which is exactly what
n-gram style drafters feed on.

Reproducibility: weights come from a fixed torch seed, and the tokenizer is
trained by ``tokenizers`` on a fixed list of Python stdlib sources. The build
is idempotent: a directory that already holds a complete build with the same
recipe is left untouched (``build_tiny_model`` returns at once).

Usage: ``python -m tiny_model PATH [--seed N] [--force]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

# Bump when anything below changes what gets written, so stale builds rebuild.
RECIPE_VERSION = 1
_STAMP = "tiny_model_recipe.json"

VOCAB_SIZE = 2048
SPECIAL_TOKENS = [
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
]
PAD, BOS, EOS = SPECIAL_TOKENS[0], SPECIAL_TOKENS[1], SPECIAL_TOKENS[2]

# Role-tagged turns, each closed by <|end|>; generation starts after the
# assistant tag. Kept trivial on purpose: tests only need it to be stable.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Fixed training corpus: stdlib modules present in every CPython 3.9+ build.
# Missing files (exotic builds) are skipped; the list order never changes.
STDLIB_FILES = [
    "os.py",
    "string.py",
    "textwrap.py",
    "functools.py",
    "collections/__init__.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "argparse.py",
    "dataclasses.py",
    "heapq.py",
    "bisect.py",
    "random.py",
    "shutil.py",
    "tempfile.py",
    "enum.py",
    "typing.py",
    "pathlib.py",
    "contextlib.py",
    "inspect.py",
]

MODEL_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=32768,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    # Larger than Llama's 0.02 so logits have clear top-1 margins: greedy
    # outputs then do not flip on float rounding between the decode and the
    # verify kernels, which keeps "spec == plain" comparisons meaningful.
    initializer_range=0.1,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


LM_HEAD_ROW_LOG_STD = 1.0


def _recipe(seed: int) -> dict:
    return {
        "recipe_version": RECIPE_VERSION,
        "seed": seed,
        "model_config": MODEL_CONFIG,
        "lm_head_row_log_std": LM_HEAD_ROW_LOG_STD,
        "stdlib_files": STDLIB_FILES,
    }


def stamp_matches(path: Path, stamp: str, recipe: dict) -> bool:
    """Whether ``path/stamp`` records exactly ``recipe`` (a finished build of it)."""
    try:
        return json.loads((path / stamp).read_text()) == json.loads(json.dumps(recipe))
    except (OSError, ValueError):
        return False


def build_atomically(path: str | os.PathLike, stamp: str, recipe: dict, build, force: bool = False) -> str:
    """Build a model directory at ``path`` with ``build(tmp_dir)`` unless one
    stamped with ``recipe`` is there; return it.

    Writes into a temporary sibling directory and renames it into place, so a
    concurrent or interrupted build never leaves a half-written model behind.
    """
    path = Path(path).resolve()
    if not force and stamp_matches(path, stamp, recipe):
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp creates 0700; the model dir should be shareable
    try:
        build(tmp)
        (tmp / stamp).write_text(json.dumps(recipe, indent=1, sort_keys=True))
        if stamp_matches(path, stamp, recipe) and not force:
            return str(path)  # someone else finished first
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(path)


def _corpus_files() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(stdlib / f) for f in STDLIB_FILES if (stdlib / f).is_file()]


def _build_tokenizer(out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = _corpus_files()
    if not files:
        raise RuntimeError("no stdlib sources found to train the tokenizer on")
    tok.train(files, trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=SPECIAL_TOKENS[3:],
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def _build_model(out_dir: Path, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**MODEL_CONFIG)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    # Give tokens a heavy-tailed "popularity" (log-normal scale per lm_head
    # row). Greedy decoding then falls into short loops within a few dozen
    # tokens, like real models' repetitive greedy output, so n-gram drafters
    # get accepted; with plain random init it wanders for hundreds of tokens.
    with torch.no_grad():
        popularity = torch.exp(LM_HEAD_ROW_LOG_STD * torch.randn(config.vocab_size, 1))
        model.lm_head.weight.mul_(popularity)
    model.generation_config = GenerationConfig(
        bos_token_id=MODEL_CONFIG["bos_token_id"],
        eos_token_id=MODEL_CONFIG["eos_token_id"],
        pad_token_id=MODEL_CONFIG["pad_token_id"],
        do_sample=False,
    )
    model.save_pretrained(str(out_dir), safe_serialization=True)


def build_tiny_model(path: str | os.PathLike, seed: int = 0, force: bool = False) -> str:
    """Build the tiny model directory at ``path`` (if needed) and return it."""

    def build(tmp: Path) -> None:
        _build_tokenizer(tmp)
        _build_model(tmp, seed)

    return build_atomically(path, _STAMP, _recipe(seed), build, force)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.path, seed=args.seed, force=args.force))


if __name__ == "__main__":
    main()
