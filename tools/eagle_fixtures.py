"""A bigram target and EAGLE-1 heads for it, built locally (tests, benchmarks).

EAGLE needs a trained draft head to accept anything; none can be downloaded
here, and none is needed: with a target whose next token depends on the
current token only, a head that agrees with it can be written down.

* **The bigram target** is the tiny Llama of ``tiny_model``
  (same tokenizer and shapes) with every ``o_proj`` and ``down_proj`` zeroed:
  each layer then adds nothing to the residual stream, the last hidden state
  is the current token's embedding, and the next token is
  ``argmax(lm_head @ norm(embed[x]))``: a function of ``x`` alone. Its
  ``lm_head`` rows are the normalised embeddings in the order of one random
  cycle through the vocabulary, so that function is that cycle: greedy text
  never repeats within 2048 tokens unless a prompt (or an earlier request)
  already holds the stretch it walks. A random ``lm_head`` would not do: its
  argmax map falls into a cycle of a dozen tokens within a few steps, and
  there would be no fresh text, where only the head can draft.
* **An EAGLE-1 head** (``LlamaForCausalLMEagle``: ``fc`` on
  ``cat(embed(token), target hidden)``, one decoder layer without its input
  norm, no final norm, ``embed_tokens`` and ``lm_head`` shared with the
  target) with ``fc = [I | 0]`` and its own ``o_proj`` / ``down_proj``
  zeroed computes ``lm_head @ embed[x]``: the target's logits up to the final
  norm's positive scale (its weights are ones), so the same argmax on every
  token. ``fc = [I + sigma * N | 0]`` (``N`` standard normal) perturbs that;
  ``agreement()`` measures on how much of the vocabulary it still agrees.

Usage: ``python -m eagle_fixtures DIR`` builds the target
and both heads under ``DIR`` and prints the noisy head's agreement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import tiny_model

RECIPE_VERSION = 2
_STAMP = "eagle_fixture_recipe.json"
# The target's logit of its next token over the others': scale * 128 against
# about scale * N(0, 11) (normalised 128-dim embeddings).
LOGIT_SCALE = 0.05
# The noisy head's perturbation: it drafts the target's next token for about
# 63% of the vocabulary (agreement(); 0.2: 90%, 0.3: 39%).
DEFAULT_SIGMA = 0.25
HEAD_LAYERS = 1


def build_bigram_target(path, seed: int = 0, force: bool = False) -> str:
    """The bigram target at ``path`` (built if needed); returns the path."""
    recipe = {"kind": "bigram-target", "version": RECIPE_VERSION, "seed": seed,
              "tiny_model": tiny_model._recipe(seed), "logit_scale": LOGIT_SCALE}

    def build(out: Path) -> None:
        import torch
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

        tiny_model._build_tokenizer(out)
        config = LlamaConfig(**tiny_model.MODEL_CONFIG)
        config.architectures = ["LlamaForCausalLM"]
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
        with torch.no_grad():
            emb = model.model.embed_tokens.weight
            emb[0].normal_(0.0, config.initializer_range)  # the pad row is zeros: give it a next token too
            normed = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps)
            order = torch.randperm(config.vocab_size)
            # lm_head row of token order[i + 1] is the normalised embedding of order[i]:
            # the next token of order[i] is order[i + 1].
            model.lm_head.weight[order.roll(-1)] = LOGIT_SCALE * normed[order]
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        model.generation_config = GenerationConfig(
            bos_token_id=tiny_model.MODEL_CONFIG["bos_token_id"], eos_token_id=tiny_model.MODEL_CONFIG["eos_token_id"],
            pad_token_id=tiny_model.MODEL_CONFIG["pad_token_id"], do_sample=False)
        model.save_pretrained(str(out), safe_serialization=True)

    return tiny_model.build_atomically(path, _STAMP, recipe, build, force)


def build_eagle_head(path, target_path, sigma: float = 0.0, seed: int = 0, force: bool = False) -> str:
    """An EAGLE-1 head for the bigram target at ``target_path``: ``fc = [I + sigma N | 0]``."""
    target_path = Path(target_path)
    recipe = {"kind": "eagle-head", "version": RECIPE_VERSION, "sigma": sigma, "seed": seed, "layers": HEAD_LAYERS,
              "target": json.loads((target_path / _STAMP).read_text())}

    def build(out: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import LlamaConfig, LlamaForCausalLM

        target = load_file(str(target_path / "model.safetensors"))
        cfg = dict(tiny_model.MODEL_CONFIG, num_hidden_layers=HEAD_LAYERS)
        config = LlamaConfig(**cfg)
        config.architectures = ["LlamaForCausalLMEagle"]
        torch.manual_seed(seed + 1)
        layer = LlamaForCausalLM(config).model.layers[0]
        h = cfg["hidden_size"]
        fc = torch.zeros(h, 2 * h)
        fc[:, :h] = torch.eye(h) + sigma * torch.randn(h, h)
        weights = {"fc.weight": fc, "fc.bias": torch.zeros(h),
                   "embed_tokens.weight": target["model.embed_tokens.weight"].clone()}
        for name, tensor in layer.state_dict().items():
            if name.startswith("input_layernorm"):
                continue  # EAGLE's first layer has none
            tensor = tensor.detach().clone().float()
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                tensor.zero_()
            weights[f"layers.0.{name}"] = tensor.contiguous()
        config.save_pretrained(str(out))
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
        for name in os.listdir(target_path):
            if name.startswith(("tokenizer", "special_tokens")):
                shutil.copy(target_path / name, out / name)

    return tiny_model.build_atomically(path, _STAMP, recipe, build, force)


def build_fixtures(root, seed: int = 0, sigma: float = DEFAULT_SIGMA) -> dict:
    """``{"target", "exact", "noisy"}``: the bigram target and its two heads."""
    root = Path(root)
    target = build_bigram_target(root / f"bigram-target-seed{seed}", seed=seed)
    return {
        "target": target,
        "exact": build_eagle_head(root / f"eagle-exact-seed{seed}", target, sigma=0.0, seed=seed),
        "noisy": build_eagle_head(root / f"eagle-noisy-seed{seed}-s{sigma}", target, sigma=sigma, seed=seed),
    }


def bigram_table(target_path):
    """The target's next token for every token (a ``torch.LongTensor``)."""
    import torch
    from safetensors.torch import load_file

    w = load_file(str(Path(target_path) / "model.safetensors"))
    emb = w["model.embed_tokens.weight"]
    normed = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + tiny_model.MODEL_CONFIG["rms_norm_eps"])
    normed = normed * w["model.norm.weight"]
    return (normed @ w["lm_head.weight"].T).argmax(-1)


def head_table(head_path, target_path):
    """The head's first draft token for every token (``lm_head @ fc[:, :h] @ embed``)."""
    from safetensors.torch import load_file

    t = load_file(str(Path(target_path) / "model.safetensors"))
    fc = load_file(str(Path(head_path) / "model.safetensors"))["fc.weight"]
    h = fc.shape[0]
    emb = t["model.embed_tokens.weight"]
    return ((emb @ fc[:, :h].T) @ t["lm_head.weight"].T).argmax(-1)


def agreement(head_path, target_path) -> float:
    """Share of the vocabulary on which the head drafts the target's next token."""
    return float((head_table(head_path, target_path) == bigram_table(target_path)).float().mean())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sigma", type=float, default=DEFAULT_SIGMA)
    args = parser.parse_args(argv)
    paths = build_fixtures(args.root, seed=args.seed, sigma=args.sigma)
    for name, path in paths.items():
        print(name, path)
    print("noisy head agreement", round(agreement(paths["noisy"], paths["target"]), 3))


if __name__ == "__main__":
    main()


def bigram_prompts(target_path, counts=None, seed: int = 0, length: int = 64) -> dict:
    """Token-id prompts for the bigram target, by kind, each continuing a
    different stretch of its cycle (so no request's output is in another's):

    * ``copy``: the prompt holds the ``length`` tokens its answer will be,
      then ends in the answer's first token's predecessor: the answer copies;
    * ``fresh``: random tokens: nothing of the answer is anywhere;
    * ``mixed``: the prompt holds two stretches of the answer (its tokens
      15-32 and 39-56 of 64): copying and fresh text alternate.

    ``counts``: prompts per kind (default 9 each)."""
    import random

    counts = counts or {"copy": 9, "fresh": 9, "mixed": 9}
    nxt = bigram_table(target_path).tolist()
    vocab = len(nxt)
    order, x = [], 0
    for _ in range(vocab):
        order.append(x)
        x = nxt[x]
    rng = random.Random(seed)
    spacing = vocab // sum(counts.values())
    if spacing < length + 8:
        raise ValueError(f"{sum(counts.values())} prompts of {length} tokens do not fit in one cycle of {vocab}")
    starts = iter(order[i * spacing] for i in range(sum(counts.values())))

    def filler(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    def walk(x0, n):
        out, t = [], x0
        for _ in range(n):
            t = nxt[t]
            out.append(t)
        return out

    prompts = {}
    for kind in ("copy", "fresh", "mixed"):
        prompts[kind] = []
        for _ in range(counts.get(kind, 0)):
            x0 = next(starts)
            answer = walk(x0, length)
            if kind == "copy":
                p = filler(8) + answer + filler(4) + [x0]
            elif kind == "fresh":
                p = filler(12) + [x0]
            else:
                a, b = length // 4, (5 * length) // 8  # the stretches start one token early: their anchor
                p = filler(6) + answer[a - 2:a + 16] + filler(3) + answer[b - 2:b + 16] + filler(3) + [x0]
            prompts[kind].append(p)
    return prompts
