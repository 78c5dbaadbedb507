#!/usr/bin/env python
"""Train the embedded tiny MTP model (``models/tiny-mtp``) on CPU.

The model is a small Qwen2-shaped decoder with sliding-window attention on every
layer plus one MiMo-style MTP layer, saved in the HF layout that vLLM serves as
``MiMoForCausalLM`` with ``--speculative-config '{"method": "mtp", ...}'``.

The PyTorch model below re-implements exactly what vLLM computes:

* target (vllm/model_executor/models/qwen2.py, mimo.py): pre-norm Qwen2 blocks (qkv
  bias, neox RoPE, SiLU MLP), every layer attends to the last ``sliding_window``
  positions including itself; the hidden state handed to the MTP layer is the
  residual stream *before* the final norm (``MiMoModel.forward`` returns
  ``hidden_states + residual``; ``compute_logits`` applies ``model.norm``).
* MTP (vllm/model_executor/models/mimo_mtp.py): at position ``p`` it takes the
  target hidden state at ``p`` and the embedding of token ``p+1`` (zeroed at
  position 0), ``input_proj(cat[hidden_layernorm(h), token_layernorm(e)])``, one
  Qwen2 decoder layer with its own (sliding-window) KV cache, ``final_layernorm``, and
  the shared ``lm_head`` -> token ``p+2``. Draft steps 2..k reuse the same layer with
  the previous step's *output* (post final_layernorm) as hidden state
  (``llm_base_proposer.propose``). Training unrolls that chain for ``--mtp-depth``
  steps, with the attention of step s seeing step-1 keys of earlier positions and
  the chain's own keys, as the drafter's KV cache does at inference.

Usage (CPU, 8.5 min on 2 idle cores)::

    python models/train_tiny_mtp.py --out models/tiny-mtp

Deterministic given ``--seed`` (and the thread count).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _load_arith():
    # Load the pure task module by path so that the farm package's own imports
    # (pydantic, sqlmodel, ...) are not needed in the training venv.
    path = REPO / "farm" / "workload" / "arith.py"
    spec = importlib.util.spec_from_file_location("arith", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["arith"] = mod
    spec.loader.exec_module(mod)
    return mod


arith = _load_arith()

# ----------------------------------------------------------------------------- config

EVAL_SEED = 20260101  # workloads/arith.jsonl (held out)
EVAL_N = 200

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NONSPECIAL_ADDED = ["<think>", "</think>"]

# Earlier turns' thinking is dropped, as Qwen3's template does, unless the request asks
# for chat_template_kwargs {"preserve_thinking": true} (Qwen3.6's switch): then the
# earlier answer goes back whole, so a conversation's next request starts with the exact
# tokens the engine generated and its prefix cache can reuse the decoded part.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}"
    "{%- if preserve_thinking is defined and preserve_thinking is true %}"
    "{%- if not content.startswith('<think>') %}"
    "{%- set content = '<think>\\n' + content %}"
    "{%- endif %}"
    "{%- else %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def render_prompt(user: str, thinking: bool) -> str:
    """Python twin of CHAT_TEMPLATE for one user turn (checked against it at save)."""
    s = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return s + ("<think>\n" if thinking else "<think>\n\n</think>\n\n")


# -------------------------------------------------------------------------- tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def build_tokenizer():
    """Byte-level BPE without merges: one token per byte, plus chat specials."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NONSPECIAL_ADDED])
    return tok


# ------------------------------------------------------------------------------ model


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    f = positions.to(torch.float32)[..., None] * inv  # [..., d/2]
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    # x [B, H, T, d]; cos/sin [T, d] or [B, T, d] broadcastable after unsqueeze
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.h, self.kv, self.hd = h, kv, d // h
        self.q_proj = nn.Linear(d, h * self.hd, bias=True)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=True)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=True)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)

    def qkv(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv != self.h:
            k = k.repeat_interleave(self.h // self.kv, dim=1)
            v = v.repeat_interleave(self.h // self.kv, dim=1)
        return q, k, v

    def out(self, o):
        B, H, T, hd = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask):
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.self_attn.out(o)
        return x + self.mlp(self.post_attention_layernorm(x))

    def finish(self, x, o):
        x = x + self.self_attn.out(o)
        return x + self.mlp(self.post_attention_layernorm(x))


class MTPLayer(DecoderLayer):
    """model.mtp_layers.N: a decoder layer plus the MiMo input/output norms."""

    def __init__(self, cfg):
        super().__init__(cfg)
        d, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.token_layernorm = RMSNorm(d, eps)
        self.hidden_layernorm = RMSNorm(d, eps)
        self.input_proj = nn.Linear(2 * d, d, bias=False)
        self.final_layernorm = RMSNorm(d, eps)

    def fuse(self, emb, hid):
        return self.input_proj(
            torch.cat([self.hidden_layernorm(hid), self.token_layernorm(emb)], dim=-1)
        )


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mtp_layers = nn.ModuleList(
            [MTPLayer(cfg) for _ in range(cfg["num_nextn_predict_layers"])]
        )


def window_mask(T: int, W: int, offset: int = 0) -> torch.Tensor:
    """Boolean [T, T]: query i sees key j iff 0 <= (i + offset) - j < W."""
    i = torch.arange(T)[:, None] + offset
    j = torch.arange(T)[None, :]
    return (j <= i) & (i - j < W)


class TinyMTP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.W = cfg["sliding_window"]
        self.hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def target(self, ids):
        """Return pre-norm hidden [B, T, D] (what vLLM hands to the MTP layer)."""
        T = ids.shape[1]
        cos, sin = rope_cos_sin(torch.arange(T), self.hd, self.cfg["rope_theta"])
        mask = window_mask(T, self.W)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return x

    def logits(self, h):
        return self.lm_head(self.model.norm(h))

    def mtp_chain(self, ids, h, depth):
        """Unrolled MTP drafting.

        Returns a list of ``depth`` tensors [B, T, D]; element s-1 at index j is the
        output of draft step s of the chain started at position j (target hidden at
        j), which predicts token j+s+1. Step s runs at position j+s-1 with input
        token j+s.
        """
        T = ids.shape[1]
        mtp = self.model.mtp_layers[0]
        emb_all = self.model.embed_tokens(ids)
        W = self.W
        outs = []
        prev = h
        K1 = V1 = None
        chain_k: list[torch.Tensor] = []
        chain_v: list[torch.Tensor] = []
        scale = 1.0 / math.sqrt(self.hd)
        for s in range(1, depth + 1):
            # input token j+s (zero-padded past the end)
            e = torch.zeros_like(emb_all)
            e[:, : T - s] = emb_all[:, s:]
            if s == 1:
                e[:, 0] = 0.0  # vLLM: inputs_embeds[positions == 0] = 0
            pos = torch.arange(T) + (s - 1)
            cos, sin = rope_cos_sin(pos, self.hd, self.cfg["rope_theta"])
            x = mtp.fuse(e, prev)
            q, k, v = mtp.self_attn.qkv(mtp.input_layernorm(x), cos, sin)
            if s == 1:
                K1, V1 = k, v
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(T, W))
            else:
                # keys: step-1 keys at positions i <= j (and within the window of the
                # query at position j+s-1), then this chain's keys of steps 2..s.
                m = window_mask(T, W, offset=s - 1) & (
                    torch.arange(T)[None, :] <= torch.arange(T)[:, None]
                )
                sc = torch.matmul(q, K1.transpose(-1, -2)) * scale
                sc = sc.masked_fill(~m, float("-inf"))
                ck = [*chain_k, k]
                cv = [*chain_v, v]
                extra = torch.stack([(q * kk).sum(-1) * scale for kk in ck], dim=-1)  # [B,H,T,s-1]
                p = torch.softmax(torch.cat([sc, extra], dim=-1), dim=-1)
                o = torch.matmul(p[..., :T], V1)
                for t, vv in enumerate(cv):
                    o = o + p[..., T + t : T + t + 1] * vv
            if s >= 2:
                chain_k.append(k)
                chain_v.append(v)
            y = mtp.final_layernorm(mtp.finish(x, o))
            outs.append(y)
            prev = y
        return outs


# ------------------------------------------------------------------------------- data


def encode_example(tok, problem, thinking: bool):
    prompt = render_prompt(problem.prompt, thinking)
    completion = arith.render_completion(problem, thinking) + "<|im_end|>"
    p_ids = tok.encode(prompt, add_special_tokens=False).ids
    c_ids = tok.encode(completion, add_special_tokens=False).ids
    return p_ids, c_ids


def make_batch(examples, pad_id):
    T = max(len(p) + len(c) for p, c in examples)
    B = len(examples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    lm = torch.zeros((B, T), dtype=torch.bool)  # lm[b, t]: token t is a loss target
    for b, (p, c) in enumerate(examples):
        seq = p + c
        ids[b, : len(seq)] = torch.tensor(seq)
        lm[b, len(p) : len(seq)] = True
    return ids, lm


def losses(model, ids, lm, depth, mtp_stride=1):
    h = model.target(ids)
    logits = model.logits(h)
    T = ids.shape[1]
    tgt = ids[:, 1:]
    msk = lm[:, 1:]
    main = F.cross_entropy(logits[:, :-1][msk], tgt[msk])
    mtp_losses = []
    if depth:
        # The MTP chain costs about as much as the trunk: train it on every
        # mtp_stride-th row only (its task is easy; the trunk's is not).
        ids, lm, h = ids[::mtp_stride], lm[::mtp_stride], h[::mtp_stride]
        outs = model.mtp_chain(ids, h, depth)
        for s, y in enumerate(outs, start=1):
            # y[:, j] predicts token j+s+1
            n = T - s - 1
            if n <= 0:
                break
            lg = model.lm_head(y[:, :n])
            t = ids[:, s + 1 :]
            m = lm[:, s + 1 :]
            mtp_losses.append(F.cross_entropy(lg[m], t[m]))
    return main, mtp_losses


# ---------------------------------------------------------------------- greedy checks


@torch.no_grad()
def greedy_generate(model, prompts_ids, max_new, eos_id, pad_id, depth=0):
    """Batched greedy decoding by full recompute; also counts simulated MTP acceptance.

    Returns (outputs, stats) where stats[s] = (#positions where draft steps 1..s
    were all right, #positions considered).
    """
    B = len(prompts_ids)
    seqs = [list(p) for p in prompts_ids]
    done = [False] * B
    for _ in range(max_new):
        L = max(len(s) for s in seqs)
        ids = torch.full((B, L), pad_id, dtype=torch.long)
        # left-aligned; read logits at each sequence's own last position
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s)
        h = model.target(ids)
        lg = model.logits(h)
        for b in range(B):
            if done[b]:
                continue
            nxt = int(lg[b, len(seqs[b]) - 1].argmax())
            seqs[b].append(nxt)
            if nxt == eos_id:
                done[b] = True
        if all(done):
            break
    outs = [s[len(p) :] for s, p in zip(seqs, prompts_ids, strict=True)]
    return outs


@torch.no_grad()
def mtp_acceptance(model, seqs, prompt_lens, depth):
    """Teacher-forced chained-draft acceptance on the model's own greedy outputs.

    For each generated position j (target hidden at j, token j+1 known), the chain
    drafts tokens j+2..j+depth+1; a draft counts as accepted when it and every earlier
    draft in the chain match. Mirrors vLLM's per-position counters approximately
    (vLLM only drafts at the last accepted token of each round).
    """
    L = max(len(s) for s in seqs)
    B = len(seqs)
    ids = torch.zeros((B, L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    h = model.target(ids)
    outs = model.mtp_chain(ids, h, depth)
    preds = [model.lm_head(y).argmax(-1) for y in outs]
    acc = [0] * depth
    tot = 0
    for b, s in enumerate(seqs):
        for j in range(prompt_lens[b] - 1, len(s) - depth - 1):
            tot += 1
            ok = True
            for st in range(depth):
                ok = ok and int(preds[st][b, j]) == s[j + st + 2]
                if ok:
                    acc[st] += 1
    return [a / max(tot, 1) for a in acc]


# ------------------------------------------------------------------------------- save


def save(model, cfg, tok, out: Path):
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = {}
    for k, v in model.state_dict().items():
        if k.startswith("model.mtp_layers."):
            pass  # names already match HF: model.mtp_layers.0.<decoder/norm/proj>
        sd[k] = v.detach().to(torch.float32).contiguous()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})

    ids = {t: tok.token_to_id(t) for t in SPECIAL + NONSPECIAL_ADDED}
    config = {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": cfg["max_position_embeddings"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        "use_sliding_window": True,
        "sliding_window": cfg["sliding_window"],
        "max_window_layers": cfg["num_hidden_layers"],
        # Explicit: transformers derives layer_types from max_window_layers (layers
        # >= max_window_layers slide), which would make every layer full attention,
        # and vLLM only sets the cache-level window when all layers slide.
        "layer_types": ["sliding_attention"] * cfg["num_hidden_layers"],
        "num_nextn_predict_layers": cfg["num_nextn_predict_layers"],
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": "float32",
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_tokenizer(tok, out, cfg["max_position_embeddings"])


def save_tokenizer(tok, out: Path, max_len: int) -> None:
    """generation_config.json and the tokenizer files (shared with train_tiny_step.py)."""
    ids = {t: tok.token_to_id(t) for t in SPECIAL + NONSPECIAL_ADDED}
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": ids["<|endoftext|>"],
                "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                "pad_token_id": ids["<|endoftext|>"],
                "do_sample": False,
            },
            indent=2,
        )
        + "\n"
    )
    tok.save(str(out / "tokenizer.json"))
    added = {}
    for t in SPECIAL + NONSPECIAL_ADDED:
        added[str(ids[t])] = {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL,
        }
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            },
            indent=2,
        )
        + "\n"
    )


def check_hf_tokenizer(out: Path, tok) -> None:
    """AutoTokenizer loads a fast tokenizer whose template matches render_prompt."""
    try:
        from transformers import AutoTokenizer
    except Exception as e:  # pragma: no cover
        print(f"[check] transformers unavailable: {e}")
        return
    at = AutoTokenizer.from_pretrained(str(out))
    assert at.is_fast, type(at)
    assert at.eos_token == "<|im_end|>", at.eos_token
    msgs = [{"role": "user", "content": "What is 12 + 34?"}]
    for thinking in (True, False):
        txt = at.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
        assert txt == render_prompt("What is 12 + 34?", thinking), repr(txt)
    txt = at.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert txt == render_prompt("What is 12 + 34?", True), repr(txt)
    s = "57+968 c0 r\n</think>\n\nAnswer: 1025<|im_end|>"
    enc = at(s, add_special_tokens=False)["input_ids"]
    assert enc == tok.encode(s, add_special_tokens=False).ids
    assert at.decode(enc, skip_special_tokens=True) == s.replace("<|im_end|>", "")
    print(f"[check] AutoTokenizer ok: {type(at).__name__}, eos={at.eos_token_id}, vocab={len(at)}")


# ------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=HERE / "tiny-mtp")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=32, help="examples per batch")
    ap.add_argument(
        "--batch-tokens",
        type=int,
        default=0,
        help="if set: length-bucketed batches of about this many padded tokens",
    )
    ap.add_argument("--pool", type=int, default=256, help="examples sorted together into batches")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mtp-depth", type=int, default=3)
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    ap.add_argument(
        "--mtp-stride", type=int, default=2, help="train the MTP chain on every n-th row of a batch"
    )
    ap.add_argument("--think-frac", type=float, default=0.75)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--min-digits", type=int, default=2)
    ap.add_argument("--max-digits", type=int, default=6)
    ap.add_argument("--eval-n", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--time-limit",
        type=float,
        default=0.0,
        help="stop early after this many seconds (breaks determinism)",
    )
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    t0 = time.time()

    tok = build_tokenizer()
    vocab = tok.get_vocab_size()
    cfg = {
        "vocab_size": ((vocab + 7) // 8) * 8,
        "hidden_size": args.hidden,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads,
        "num_hidden_layers": args.layers,
        "intermediate_size": args.intermediate,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "sliding_window": args.window,
        "max_position_embeddings": 512,
        "num_nextn_predict_layers": 1,
    }
    assert args.hidden // args.heads == 64, "vLLM CPU attention needs head_dim 64"
    pad_id = tok.token_to_id("<|endoftext|>")
    eos_id = tok.token_to_id("<|im_end|>")

    held_out = arith.make_problems(EVAL_N, EVAL_SEED)
    exclude = {arith.parse_operands(p.prompt) for p in held_out}
    rng = random.Random(args.seed)

    model = TinyMTP(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in model.model.mtp_layers.parameters())
    print(f"params: {n_params / 1e6:.2f}M (mtp {n_mtp / 1e6:.2f}M) cfg={cfg}", flush=True)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
    )

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        prog = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * prog)))

    def batches():
        # Fixed batches of --batch random examples, or (--batch-tokens N) pools of
        # examples sorted by length and cut into batches of about N padded tokens.
        # The random batches learned faster per example in our runs (the
        # bucketed run had not left its loss plateau after 250 steps).
        chunk = 0
        while True:
            probs = arith.make_problems(
                args.pool if args.batch_tokens else args.batch,
                args.seed * 1000 + chunk,
                min_digits=args.min_digits,
                max_digits=args.max_digits,
                exclude=exclude,
            )
            chunk += 1
            exs = [encode_example(tok, p, rng.random() < args.think_frac) for p in probs]
            if not args.batch_tokens:
                yield exs
                continue
            exs.sort(key=lambda e: len(e[0]) + len(e[1]))
            out, cur = [], []
            for e in exs:
                n = len(e[0]) + len(e[1])
                if cur and (len(cur) + 1) * n > args.batch_tokens:
                    out.append(cur)
                    cur = []
                cur.append(e)
            if cur:
                out.append(cur)
            rng.shuffle(out)
            yield from out

    ema = None
    stream = batches()
    for step in range(args.steps):
        ids, lm = make_batch(next(stream), pad_id)
        main_l, mtp_ls = losses(model, ids, lm, args.mtp_depth, args.mtp_stride)
        loss = main_l + (args.mtp_weight * sum(mtp_ls) / len(mtp_ls) if mtp_ls else 0.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        vals = [main_l.item()] + [x.item() for x in mtp_ls]
        ema = vals if ema is None else [0.9 * a + 0.1 * b for a, b in zip(ema, vals, strict=False)]
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(
                f"step {step:5d} lr {lr_at(step):.2e} main {ema[0]:.4f} mtp "
                + " ".join(f"{x:.3f}" for x in ema[1:])
                + f"  B={ids.shape[0]} T={ids.shape[1]} {el:6.0f}s",
                flush=True,
            )
        if args.time_limit and time.time() - t0 > args.time_limit:
            print(f"time limit reached at step {step}", flush=True)
            break
    train_s = time.time() - t0
    print(f"training done in {train_s:.0f}s", flush=True)

    model.eval()
    save(model, cfg, tok, args.out)
    check_hf_tokenizer(args.out, tok)

    # Quick greedy check on held-out problems (thinking on and off).
    ev = held_out[: args.eval_n]
    for thinking in (True, False):
        prompts = [
            tok.encode(render_prompt(p.prompt, thinking), add_special_tokens=False).ids for p in ev
        ]
        outs = greedy_generate(model, prompts, 260 if thinking else 16, eos_id, pad_id)
        texts = [tok.decode([t for t in o if t != eos_id], skip_special_tokens=False) for o in outs]
        acc = sum(arith.score(t, p.answer) for t, p in zip(texts, ev, strict=True)) / len(ev)
        lens = [len(p) + len(o) for p, o in zip(prompts, outs, strict=True)]
        mode = "on" if thinking else "off"
        line = f"eval thinking={mode}: accuracy {acc:.3f} on {len(ev)}; "
        line += f"seq len {min(lens)}-{max(lens)}"
        if thinking:
            rates = mtp_acceptance(
                model,
                [p + o for p, o in zip(prompts, outs, strict=True)],
                [len(p) for p in prompts],
                args.mtp_depth,
            )
            al = 1 + sum(rates)
            line += "; sim. MTP per-pos " + " ".join(f"{r:.3f}" for r in rates) + f" (AL~{al:.2f})"
            print("sample:", repr(texts[0][:400]))
        print(line, flush=True)
    print(f"total time {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
