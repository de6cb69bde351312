"""Train the tiny copier: a Llama (4M non-zero weights) that copies from its prompt, on 2 CPU cores.

Why it is built this way. A model this small, trained for minutes on a CPU, does
not learn to copy a whole file by gradient descent: its induction heads match
a token or two and jump between look-alike lines. So the copying circuit is
written into the first five layers directly, with nothing but what a Llama has
(RMSNorm, RoPE attention with a partial rotary dimension, linear maps), and
frozen; the last three layers, the embedding's free part and the output head
are trained on the standard library's sources, to write code and to use what
the circuit proposes.

The circuit (``p(x)`` and ``c(x)`` are fixed random unit codes of token ``x``,
7 and 64 dimensions):

* layer 0: four offset heads, each attending exactly ``i = 1..4`` tokens back
  (their RoPE phases aligned so the score peaks at that distance), write
  ``p(t-1) .. p(t-4)`` into window slots 0-3;
* layers 1-3: one head each, at offsets 4, 8 and 16, copies the window of that
  earlier position into the next slots: 8, 16, then 31 tokens of context. Layer
  1 also raises an "answer" flag once an ``<|assistant|>`` tag is behind;
* layer 4: the copy head. Its query is the last 31 tokens ``p(t) .. p(t-30)``,
  its key the 31 tokens before each position ``s``, both in unrotated head
  dimensions, so the score counts aligned matches: the position after the
  longest agreeing context wins, not the last one-token match (31 tokens tell
  apart every place in the held-out code; 13 left a third of the files with
  look-alike lines). Keys in the answer are barred (the answer never copies
  itself), and ``<|bos|>`` is a sink that takes the attention when fewer than
  about four tokens agree. The winner's ``c`` code goes to a copy slot that the
  output head reads. A second head does the same inside the answer and pushes
  down what followed an earlier occurrence of the answer's own context, so
  greedy decoding does not loop.

Usage::

    python scripts/train_tiny_copier.py [--minutes 24] [--out lookahead/testing/tiny_copier]

Fixed seeds; prints progress and loss. The tokenizer (byte-level BPE, 4096
tokens) is trained first, on the same local sources.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import copier_tasks as tasks  # noqa: E402

sys.path.insert(0, str(REPO))
from lookahead.testing import TINY_COPIER  # noqa: E402
from lookahead.testing.tiny_model import CHAT_TEMPLATE  # noqa: E402  (the same role tags)

SEED = 0
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", tasks.USER, tasks.ASSISTANT, tasks.END]
PAD_ID, BOS_ID = 0, 1
ASSISTANT_ID, END_ID = 5, 6

HIDDEN = 384
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 256
ROTARY = 32  # partial_rotary_factor 0.125: 16 RoPE pairs; dims 32..255 of a head are unrotated
LAYERS, CIRCUIT_LAYERS = 8, 5
INTERMEDIATE = 512
ROPE_THETA = 10000.0
MAX_POSITIONS = 4096
CONFIG = dict(
    vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
    num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
    head_dim=HEAD_DIM, partial_rotary_factor=ROTARY / HEAD_DIM, rope_theta=ROPE_THETA,
    max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, hidden_act="silu",
    tie_word_embeddings=False, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=END_ID,
)

# Residual-stream layout: each circuit feature owns a slice of the hidden vector.
CODE = slice(0, 64)          # c(x): the token's identity, read by the output head
ONE, BOS_FLAG, ASST_FLAG, ANSWER = 64, 65, 66, 67
P = slice(68, 75)            # p(x): the token's match code
COPY = slice(75, 139)        # c of the token the copy head proposes, less c of a repeat
SLOT_DIM, SLOTS = 7, 31
WINDOW = slice(139, 139 + SLOT_DIM * SLOTS)  # slot i holds p(t-1-i)
LM = slice(356, HIDDEN)      # learned part of the embedding

OFFSET_SCORE = 20.0          # per RoPE pair: the offset heads' peak is 22 nats above its neighbours
MATCH_SCORE = 6.0            # nats per aligned matching token in the copy head
MATCH_WEIGHTS = [3.0] * 4 + [1.0] * (SLOTS - 4)  # the nearest tokens count more
SINK_MATCHES = 10.0          # copy only when the context agrees on more than this
ANSWER_BAR = 400.0           # nats: keys inside the answer are never copied
COPY_LOGIT = 20.0            # the proposed token's logit from the copy slot
REPEAT_MATCHES = 10.0        # the answer repeats itself when its own context agrees this much
REPEAT_PENALTY = 0.4         # ... and the token that followed then loses 0.4 x COPY_LOGIT


# Layer -> (offset, slots copied): the window doubles layer by layer, 4 -> 8 -> 16 -> 31 tokens.
WINDOW_COPIES = {1: (4, 4), 2: (8, 8), 3: (16, SLOTS - 16)}
# Squared norm of the residual entering each circuit layer: four unit parts in
# the embedding (code, one, p, the learned part), then the slots filled so far
# (measured on held-out code: the copies are not quite unit). RMSNorm's factor is
# thus known in advance, and the weights absorb it.
NOMINAL_FEATURES = {0: 4, 1: 8, 2: 12, 3: 20.2, 4: 31.2}
FINAL_FEATURES = 32.2


def slot(i: int) -> slice:
    return slice(WINDOW.start + SLOT_DIM * i, WINDOW.start + SLOT_DIM * (i + 1))


def inv_freq() -> torch.Tensor:
    return 1.0 / (ROPE_THETA ** (torch.arange(0, ROTARY, 2, dtype=torch.float64) / ROTARY))


# ---------------------------------------------------------------- tokenizer
def build_tokenizer(out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(f) for f in tasks.training_files()], trainer)
    # Every encoded request starts with <|bos|>: the copy head's sink.
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", pair="<|bos|> $A $B",
                                                       special_tokens=[("<|bos|>", BOS_ID)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token=tasks.END, pad_token="<|pad|>",
        additional_special_tokens=SPECIAL_TOKENS[2:], clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


# ---------------------------------------------------------------- the circuit
def unit_rows(n: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    return x / x.norm(dim=1, keepdim=True)


def nominal_scale(features: float) -> float:
    """RMSNorm's factor for a residual made of ``features`` unit-norm parts."""
    return math.sqrt(HIDDEN / features)


def build_circuit(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The frozen weights: the embedding's fixed part and the circuit layers (see the module docstring)."""
    w: dict[str, torch.Tensor] = {}
    d, hd = HIDDEN, HEAD_DIM
    emb = torch.zeros(VOCAB_SIZE, d, dtype=torch.float64)
    emb[:, CODE] = unit_rows(VOCAB_SIZE, CODE.stop - CODE.start, gen)
    emb[:, P] = unit_rows(VOCAB_SIZE, P.stop - P.start, gen)
    emb[:, ONE] = 1.0
    for special in (PAD_ID, BOS_ID):  # never copied, never matched
        emb[special, CODE] = 0.0
        emb[special, P] = 0.0
    emb[BOS_ID, BOS_FLAG] = 1.0
    emb[ASSISTANT_ID, ASST_FLAG] = 1.0
    w["model.embed_tokens.weight"] = emb
    freqs = inv_freq()

    def offset_query(q: torch.Tensor, head: int, offset: int, scale: float) -> None:
        # score = sum_j A cos((m - n - offset) * theta_j): the key is the constant (1, 0)
        # in every pair, the query that pair rotated back by offset * theta_j.
        amp = OFFSET_SCORE * math.sqrt(hd) / scale
        for j, theta in enumerate(freqs.tolist()):
            q[head * hd + j, ONE] = amp * math.cos(offset * theta)
            q[head * hd + ROTARY // 2 + j, ONE] = -amp * math.sin(offset * theta)

    def offset_key(k: torch.Tensor, kv: int, scale: float) -> None:
        # <|bos|>'s residual stays small, so RMSNorm scales it up more than the
        # layer's nominal factor; its flag takes that back, else its key would
        # outweigh the offset's.
        for j in range(ROTARY // 2):
            k[kv * hd + j, ONE] = 1.0 / scale
            k[kv * hd + j, BOS_FLAG] = 1.0 / nominal_scale(3) - 1.0 / scale

    for layer in range(CIRCUIT_LAYERS):
        q = torch.zeros(HEADS * hd, d, dtype=torch.float64)
        k = torch.zeros(KV_HEADS * hd, d, dtype=torch.float64)
        v = torch.zeros(KV_HEADS * hd, d, dtype=torch.float64)
        o = torch.zeros(d, HEADS * hd, dtype=torch.float64)
        if layer == 0:
            s = nominal_scale(NOMINAL_FEATURES[0])
            for kv in range(KV_HEADS):
                offset_key(k, kv, s)
                for i in range(SLOT_DIM):
                    v[kv * hd + i, P.start + i] = 1.0 / s
            for head in range(4):  # offsets 1..4 -> slots 0..3
                offset_query(q, head, head + 1, s)
                for i in range(SLOT_DIM):
                    o[slot(head).start + i, head * hd + i] = 1.0
        elif layer in WINDOW_COPIES:
            # One head at ``offset`` copies slots [0, n) of t-offset into slots [offset, offset+n).
            s = nominal_scale(NOMINAL_FEATURES[layer])
            offset, n = WINDOW_COPIES[layer]
            offset_key(k, 0, s)
            offset_query(q, 0, offset, s)
            for i in range(n * SLOT_DIM):
                v[i, WINDOW.start + i] = 1.0 / s
                o[slot(offset).start + i, i] = 1.0
            if layer == 1:
                # Head 2 (kv 1): the answer flag, 40 nats towards any <|assistant|> tag.
                q[2 * hd + ROTARY, ONE] = 40.0 * math.sqrt(hd) / s
                k[hd + ROTARY, ASST_FLAG] = 1.0 / s
                v[hd, ASST_FLAG] = 1.0 / s
                o[ANSWER, 2 * hd] = 1.0
        elif layer == CIRCUIT_LAYERS - 1:
            s = nominal_scale(NOMINAL_FEATURES[layer])
            amp = MATCH_SCORE * math.sqrt(hd) / (s * s)
            for i in range(SLOTS):
                qdims = range(ROTARY + SLOT_DIM * i, ROTARY + SLOT_DIM * (i + 1))
                src = P if i == 0 else slot(i - 1)
                for j, qd in enumerate(qdims):
                    q[qd, src.start + j] = amp * MATCH_WEIGHTS[i]
                    k[qd, slot(i).start + j] = 1.0
            spare = ROTARY + SLOT_DIM * SLOTS
            q[spare, ONE] = amp * SINK_MATCHES
            # <|bos|>'s residual never grows (nothing is written at position 0), so
            # RMSNorm scales it by its own factor, not the layer's nominal one.
            k[spare, BOS_FLAG] = s / nominal_scale(3)
            q[spare + 1, ONE] = -amp * ANSWER_BAR / MATCH_SCORE
            k[spare + 1, ANSWER] = 1.0
            # Head 1 shares the copy head's keys and values but looks only inside the
            # answer: where the answer's own last tokens agree with an earlier place in
            # it, the token that followed there is pushed down, so greedy decoding
            # does not loop. A copy from the prompt outweighs it.
            q[hd: 2 * hd] = q[:hd]
            q[hd + spare, ONE] = amp * (REPEAT_MATCHES + ANSWER_BAR / MATCH_SCORE)
            q[hd + spare + 1, ONE] = amp * ANSWER_BAR / MATCH_SCORE
            for i in range(CODE.stop - CODE.start):
                v[i, CODE.start + i] = 1.0 / s
                o[COPY.start + i, i] = 1.0
                o[COPY.start + i, hd + i] = -REPEAT_PENALTY
        pre = f"model.layers.{layer}."
        w[pre + "self_attn.q_proj.weight"] = q
        w[pre + "self_attn.k_proj.weight"] = k
        w[pre + "self_attn.v_proj.weight"] = v
        w[pre + "self_attn.o_proj.weight"] = o
        w[pre + "input_layernorm.weight"] = torch.ones(d, dtype=torch.float64)
        w[pre + "post_attention_layernorm.weight"] = torch.ones(d, dtype=torch.float64)
        w[pre + "mlp.gate_proj.weight"] = torch.zeros(INTERMEDIATE, d, dtype=torch.float64)
        w[pre + "mlp.up_proj.weight"] = torch.zeros(INTERMEDIATE, d, dtype=torch.float64)
        w[pre + "mlp.down_proj.weight"] = torch.zeros(d, INTERMEDIATE, dtype=torch.float64)
    return {name: t.float() for name, t in w.items()}


# ---------------------------------------------------------------- the model in torch
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style RoPE on the first ROTARY dims of each head (SGLang's partial rotary)."""
    rot, rest = x[..., :ROTARY], x[..., ROTARY:]
    x1, x2 = rot[..., : ROTARY // 2], rot[..., ROTARY // 2:]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((rotated, rest), dim=-1)


def rope_tables(n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(n, dtype=torch.float32, device=device)[:, None] * inv_freq().float()[None, :]
    return angles.cos(), angles.sin()


def attention(w: dict, layer: int, x: torch.Tensor, cos, sin) -> torch.Tensor:
    """One Llama attention block's output (before the residual add), as SGLang computes it."""
    pre = f"model.layers.{layer}."
    b, t, _ = x.shape
    h = rms_norm(x, w[pre + "input_layernorm.weight"])
    q = (h @ w[pre + "self_attn.q_proj.weight"].T).view(b, t, HEADS, HEAD_DIM)
    k = (h @ w[pre + "self_attn.k_proj.weight"].T).view(b, t, KV_HEADS, HEAD_DIM)
    v = (h @ w[pre + "self_attn.v_proj.weight"].T).view(b, t, KV_HEADS, HEAD_DIM)
    c, s = cos[:t, None, :], sin[:t, None, :]
    q, k = rope(q, c, s), rope(k, c, s)
    rep = HEADS // KV_HEADS
    q, k, v = q.transpose(1, 2), k.repeat_interleave(rep, 2).transpose(1, 2), v.repeat_interleave(rep, 2).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, t, HEADS * HEAD_DIM) @ w[pre + "self_attn.o_proj.weight"].T


def mlp(w: dict, layer: int, x: torch.Tensor) -> torch.Tensor:
    pre = f"model.layers.{layer}."
    h = rms_norm(x, w[pre + "post_attention_layernorm.weight"])
    return (F.silu(h @ w[pre + "mlp.gate_proj.weight"].T) * (h @ w[pre + "mlp.up_proj.weight"].T)) @ w[pre + "mlp.down_proj.weight"].T


def forward(w: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits ``[b, t, vocab]`` of a Llama state dict: the reference the compact
    training forward and SGLang are checked against."""
    cos, sin = rope_tables(ids.shape[1])
    x = F.embedding(ids, w["model.embed_tokens.weight"])
    for layer in range(LAYERS):
        x = x + attention(w, layer, x, cos, sin)
        x = x + mlp(w, layer, x)
    return rms_norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


# ---------------------------------------------------------------- trainable part
LM_HEADS = 2                 # the learned layers use query heads 0-1 (kv head 0); the rest stay zero
OUT = slice(228, HIDDEN)     # the learned layers write here (the far window slots, the embedding's free part)


class Trainable(torch.nn.Module):
    """The learned weights, kept compact (only what is not zero); ``weights()``
    lays them out as a full Llama state dict around the frozen circuit.

    The learned layers write into ``OUT`` only, and the output head's learned
    part reads only ``OUT``, which keeps the checkpoint to a few MB. Its columns
    on the copy slot stay fixed: the learned layers can outvote the copy circuit
    (a rename) but not retune it.
    """

    def __init__(self, circuit: dict, gen: torch.Generator):
        super().__init__()
        self.circuit = circuit
        d, hd, out = HIDDEN, HEAD_DIM, OUT.stop - OUT.start

        def param(*shape, std=0.02):
            return torch.nn.Parameter(torch.randn(*shape, generator=gen) * std)

        self.lm_embed = param(VOCAB_SIZE, LM.stop - LM.start, std=1.0)
        self.layers = torch.nn.ParameterDict()
        for layer in range(CIRCUIT_LAYERS, LAYERS):
            pre = f"l{layer}_"
            self.layers[pre + "q"] = param(LM_HEADS * hd, d)
            self.layers[pre + "k"] = param(hd, d)
            self.layers[pre + "v"] = param(hd, d)
            self.layers[pre + "o"] = param(out, LM_HEADS * hd, std=0.02 / math.sqrt(2 * LAYERS))
            self.layers[pre + "ln1"] = torch.nn.Parameter(torch.ones(d))
            self.layers[pre + "ln2"] = torch.nn.Parameter(torch.ones(d))
            self.layers[pre + "gate"] = param(INTERMEDIATE, d)
            self.layers[pre + "up"] = param(INTERMEDIATE, d)
            self.layers[pre + "down"] = param(out, INTERMEDIATE, std=0.02 / math.sqrt(2 * LAYERS))
        self.norm = torch.nn.Parameter(torch.ones(d))
        head = torch.randn(VOCAB_SIZE, out, generator=gen) * 0.02
        head[[BOS_ID, PAD_ID]] = 0.0
        self.lm_head = torch.nn.Parameter(head)
        # The copy slot holds c(proposed token), scaled by the final norm.
        final_scale = nominal_scale(FINAL_FEATURES)
        self.register_buffer("head_copy", circuit["model.embed_tokens.weight"][:, CODE] * (COPY_LOGIT / final_scale))
        bar = torch.zeros(VOCAB_SIZE)
        bar[[BOS_ID, PAD_ID]] = -30.0 / final_scale  # never generated
        self.register_buffer("head_one", bar)

    def embedding(self) -> torch.Tensor:
        fixed = self.circuit["model.embed_tokens.weight"][:, : LM.start]
        lm = self.lm_embed / self.lm_embed.norm(dim=1, keepdim=True)  # fixed norm keeps the circuit's scale
        return torch.cat((fixed, lm), dim=1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits; the same function as ``forward(self.weights(), ids)``, without the zeros."""
        cos, sin = rope_tables(ids.shape[1])
        x = F.embedding(ids, self.embedding())
        with torch.no_grad():
            writes = torch.zeros_like(x)
            for layer in range(CIRCUIT_LAYERS):
                writes = writes + attention(self.circuit, layer, x.detach() + writes, cos, sin)
        x = x + writes
        b, t, _ = x.shape
        pad = (OUT.start, HIDDEN - OUT.stop)
        for layer in range(CIRCUIT_LAYERS, LAYERS):
            p = f"l{layer}_"
            h = rms_norm(x, self.layers[p + "ln1"])
            q = (h @ self.layers[p + "q"].T).view(b, t, LM_HEADS, HEAD_DIM)
            k = (h @ self.layers[p + "k"].T).view(b, t, 1, HEAD_DIM)
            v = (h @ self.layers[p + "v"].T).view(b, t, 1, HEAD_DIM)
            c, s = cos[:t, None, :], sin[:t, None, :]
            q, k = rope(q, c, s).transpose(1, 2), rope(k, c, s).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k.expand(b, LM_HEADS, t, HEAD_DIM),
                                               v.transpose(1, 2).expand(b, LM_HEADS, t, HEAD_DIM), is_causal=True)
            x = x + F.pad(a.transpose(1, 2).reshape(b, t, -1) @ self.layers[p + "o"].T, pad)
            h = rms_norm(x, self.layers[p + "ln2"])
            m = F.silu(h @ self.layers[p + "gate"].T) * (h @ self.layers[p + "up"].T)
            x = x + F.pad(m @ self.layers[p + "down"].T, pad)
        y = rms_norm(x, self.norm)
        return y[..., OUT] @ self.lm_head.T + y[..., COPY] @ self.head_copy.T + y[..., ONE: ONE + 1] * self.head_one

    def weights(self) -> dict[str, torch.Tensor]:
        w = dict(self.circuit)
        w["model.embed_tokens.weight"] = self.embedding()
        d, hd = HIDDEN, HEAD_DIM

        def full(rows: int, cols: int, block: torch.Tensor, r0: int = 0, c0: int = 0) -> torch.Tensor:
            return F.pad(block, (c0, cols - c0 - block.shape[1], r0, rows - r0 - block.shape[0]))

        for layer in range(CIRCUIT_LAYERS, LAYERS):
            p, pre = f"l{layer}_", f"model.layers.{layer}."
            w[pre + "self_attn.q_proj.weight"] = full(HEADS * hd, d, self.layers[p + "q"])
            w[pre + "self_attn.k_proj.weight"] = full(KV_HEADS * hd, d, self.layers[p + "k"])
            w[pre + "self_attn.v_proj.weight"] = full(KV_HEADS * hd, d, self.layers[p + "v"])
            w[pre + "self_attn.o_proj.weight"] = full(d, HEADS * hd, self.layers[p + "o"], r0=OUT.start)
            w[pre + "input_layernorm.weight"] = self.layers[p + "ln1"]
            w[pre + "post_attention_layernorm.weight"] = self.layers[p + "ln2"]
            w[pre + "mlp.gate_proj.weight"] = self.layers[p + "gate"]
            w[pre + "mlp.up_proj.weight"] = self.layers[p + "up"]
            w[pre + "mlp.down_proj.weight"] = full(d, INTERMEDIATE, self.layers[p + "down"], r0=OUT.start)
        w["model.norm.weight"] = self.norm
        head = full(VOCAB_SIZE, d, self.lm_head, c0=OUT.start) + full(VOCAB_SIZE, d, self.head_copy, c0=COPY.start)
        head[:, ONE] = self.head_one
        w["lm_head.weight"] = head
        return w


# ---------------------------------------------------------------- data
class Examples:
    """An endless, seeded stream of (token ids, loss mask) training examples."""

    def __init__(self, tokenizer, max_len: int, seed: int):
        self.tok = tokenizer
        self.max_len = max_len
        self.rng = random.Random(seed)
        self.chunks: list[str] = []
        self.sources: list[str] = []
        for f in tasks.training_files():
            text = tasks.read(f)
            self.sources.append(text)
            self.chunks += tasks.code_chunks(text)
        self.rng.shuffle(self.chunks)
        self.i = 0
        self.renamable = tasks.single_token_name(tokenizer)

    def _encode(self, prompt: str, answer: str | None):
        if answer is None:  # plain code continuation: loss everywhere
            ids = self.tok(prompt)["input_ids"][: self.max_len]
            return ids, [0] + [1] * (len(ids) - 1)
        p = self.tok(prompt)["input_ids"]
        a = self.tok(answer, add_special_tokens=False)["input_ids"] + [END_ID]
        ids = (p + a)[: self.max_len]
        return ids, ([0] * len(p) + [1] * len(a))[: self.max_len]

    def next(self):
        while True:
            chunk = self.chunks[self.i % len(self.chunks)]
            self.i += 1
            kind = self.rng.random()
            if kind < 0.4:
                task = tasks.edit_task(chunk, self.rng, self.renamable)
            elif kind < 0.5:
                task = tasks.quote_task(chunk, self.rng)
            elif kind < 0.75:
                task = tasks.write_task(chunk, self.rng)
            else:
                src = self.rng.choice(self.sources)
                start = self.rng.randrange(0, max(1, len(src) - 3000))
                task = (src[start: start + 3000], None)
            if task is None:
                continue
            ids, mask = self._encode(*task)
            if sum(mask) >= 8:
                return ids, mask

    def batch(self, tokens: int):
        """Examples of similar length padded into one batch of about ``tokens`` tokens."""
        pool = sorted((self.next() for _ in range(16)), key=lambda e: len(e[0]))
        start = self.rng.randrange(0, len(pool))
        length = len(pool[start][0])
        n = max(1, min(len(pool), tokens // max(length, 1)))
        group = pool[max(0, start - n + 1): start + 1]
        t = max(len(e[0]) for e in group)
        ids = torch.full((len(group), t), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(group), t))
        for r, (e, m) in enumerate(group):
            ids[r, : len(e)] = torch.tensor(e)
            mask[r, : len(m)] = torch.tensor(m, dtype=torch.float32)
        return ids, mask


# ---------------------------------------------------------------- export
def export(weights: dict, tokenizer_dir: Path, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    # bfloat16 halves the checkpoint; SGLang casts it back to the float32 it serves in.
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = dict(CONFIG, architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype="bfloat16",
                  rope_parameters={"rope_theta": ROPE_THETA, "rope_type": "default",
                                   "partial_rotary_factor": ROTARY / HEAD_DIM})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": END_ID, "pad_token_id": PAD_ID, "do_sample": False}, indent=2))
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            (out / f.name).write_bytes(f.read_bytes())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(TINY_COPIER))
    ap.add_argument("--minutes", type=float, default=24.0, help="training time budget")
    ap.add_argument("--batch-tokens", type=int, default=6144)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    out = Path(args.out)
    tok_dir = Path(tempfile.mkdtemp(prefix="tiny_copier_tokenizer."))
    t0 = time.time()
    tokenizer = build_tokenizer(tok_dir)
    print(f"tokenizer: {len(tokenizer)} tokens in {time.time() - t0:.0f} s", flush=True)

    gen = torch.Generator().manual_seed(SEED)
    model = Trainable(build_circuit(gen), gen)
    n_params = sum(t.numel() for t in model.weights().values())
    print(f"model: {n_params / 1e6:.1f}M parameters, {LAYERS} layers ({CIRCUIT_LAYERS} frozen circuit layers)", flush=True)
    data = Examples(tokenizer, args.max_len, SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    budget = args.minutes * 60
    start, step, seen, smooth = time.time(), 0, 0, None
    while time.time() - start < budget:
        frac = (time.time() - start) / budget
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, mask = data.batch(args.batch_tokens)
        logits = model(ids[:, :-1])
        loss_all = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), ids[:, 1:].reshape(-1), reduction="none")
        m = mask[:, 1:].reshape(-1)
        loss = (loss_all * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += int(m.sum())
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if step % 20 == 0:
            el = time.time() - start
            print(f"step {step:5d}  {el / 60:5.1f} min  loss {smooth:.3f}  lr {lr:.2e}  "
                  f"{seen / 1e6:.2f}M target tokens ({seen / el:.0f}/s)", flush=True)
    export(model.weights(), tok_dir, out)
    print(f"saved {out} after {step} steps, {(time.time() - start) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
