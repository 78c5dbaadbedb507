#!/usr/bin/env python
"""Train the embedded Step-3.5-shaped model (``models/tiny-step``) on CPU.

The model has seed 1's shape (Step-3.5-Flash, SWA + MTP3; docs/design.md, "What the
CPU engine can serve"): a ``Step3p5ForCausalLM`` whose
layers interleave one full-attention layer with three sliding-window layers, MoE on
the layer ``moe_layers_enum`` names, and three MTP layers (``num_nextn_predict_layers:
3``), one per draft step, each with its own shared head, served by vLLM with
``--speculative-config '{"method": "mtp", "num_speculative_tokens": 3}'``.

The PyTorch model below re-implements what vLLM 0.32.0 computes
(``vllm/model_executor/models/step3p5.py``, ``step3p5_mtp.py``,
``vllm/v1/spec_decode/step3p5.py``):

* target: pre-norm blocks with Gemma RMS norms (``x * (1 + w)``), per-head q/k norms
  before neox RoPE, no qkv bias, SiLU MLP; the MoE layer routes with a renormalised
  softmax over the top k experts, plus a shared expert. The hidden state handed to
  the drafter is the residual stream before the final norm.
* drafter: step ``s`` (1-based) uses MTP layer ``s - 1``: ``eh_proj(cat[enorm(embed(
  token)), hnorm(hidden)])``, one decoder block, ``shared_head.norm`` and its own
  ``shared_head.head``. Step 1 runs at every position ``p`` with the target hidden at
  ``p`` and token ``p + 1``, so its KV cache is complete. Steps 2 and 3 run only at
  the last position of each round with the previous step's block output (before the
  head's norm): their KV caches hold only what earlier rounds wrote there, the rest
  of each slot is empty. Training shows them exactly that: attention over their own
  position plus a random half of earlier positions, the others empty (zero key and
  value), so the later steps learn to lean on the chain rather than on a cache that
  vLLM does not fill. That, and a drafter trained on a frozen target (the trunk is
  not shaped for drafting) for a budget short of convergence, make the drafter weaker
  than the target the way real MTP heads are: right on the copies and format tokens
  of the scratchpad, often wrong on the digits that need a column's sum.

Training is in two phases: the target alone (``--steps``), then the three MTP layers
on the frozen target (``--mtp-steps``). Both use the addition task of
``farm/workload/arith.py`` with 1..5-digit operands, thinking on for
``--think-frac`` of the examples (the rest answer directly: short sums can be done
without a scratchpad, long ones cannot), and the sliding-window layers trained with
their window on half the batches and full attention on the other half, so that the
farm's ``sliding_window: off`` axis changes what the model sees without breaking it.

Usage (CPU)::

    python models/train_tiny_step.py --out models/tiny-step

Deterministic given ``--seed`` and the thread count.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(HERE))

import train_tiny_mtp as base  # noqa: E402  (tokenizer, chat template, task, batches)

arith = base.arith

LAYER_TYPES = ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]


class GemmaRMSNorm(nn.Module):
    """vLLM's GemmaRMSNorm: the weight is an offset from 1 (zero-initialised)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * (1.0 + self.weight)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h, kv, hd = cfg["hidden_size"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        self.h, self.kv, self.hd = h, kv, hd
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.q_norm = GemmaRMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = GemmaRMSNorm(hd, cfg["rms_norm_eps"])

    def qkv(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.h, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = base.apply_rope(q, cos, sin), base.apply_rope(k, cos, sin)
        if self.kv != self.h:
            k = k.repeat_interleave(self.h // self.kv, dim=1)
            v = v.repeat_interleave(self.h // self.kv, dim=1)
        return q, k, v

    def out(self, o):
        B, H, T, hd = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * hd))


class MLP(nn.Module):
    def __init__(self, d: int, i: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Step3p5 FusedMoEBlock with softmax routing (top-k, renormalised) + shared expert.

    Softmax, not Step-3.5-Flash's sigmoid: vLLM's CPU router serves sigmoid scores only
    through grouped top-k, which Step3p5's MoE block does not ask for; the router bias
    (zero) only steers sigmoid choices.
    """

    def __init__(self, cfg):
        super().__init__()
        d, e, i = cfg["hidden_size"], cfg["moe_num_experts"], cfg["moe_intermediate_size"]
        self.top_k = cfg["moe_top_k"]
        self.gate = nn.Linear(d, e, bias=False)
        self.register_buffer("router_bias", torch.zeros(e))
        self.gate_proj = nn.Parameter(torch.empty(e, i, d))
        self.up_proj = nn.Parameter(torch.empty(e, i, d))
        self.down_proj = nn.Parameter(torch.empty(e, d, i))
        for p in (self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(p, std=0.02)
        self.share_expert = MLP(d, cfg["share_expert_dim"])

    def forward(self, x):
        logits = self.gate(x).float()
        top = torch.topk(logits, self.top_k, dim=-1)
        w = torch.softmax(top.values, dim=-1)  # renormalised softmax over the top k
        route = torch.zeros_like(logits).scatter(-1, top.indices, w)  # [..., E]
        g = torch.einsum("...d,eid->...ei", x, self.gate_proj)
        u = torch.einsum("...d,eid->...ei", x, self.up_proj)
        y = torch.einsum("...ei,edi->...ed", F.silu(g) * u, self.down_proj)
        return (route.unsqueeze(-1) * y).sum(-2) + self.share_expert(x)


class Block(nn.Module):
    def __init__(self, cfg, moe: bool):
        super().__init__()
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = GemmaRMSNorm(cfg["hidden_size"], eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = GemmaRMSNorm(cfg["hidden_size"], eps)
        if moe:
            self.moe = MoE(cfg)
        else:
            self.mlp = MLP(cfg["hidden_size"], cfg["intermediate_size"])

    def ffn(self, x):
        f = self.moe if hasattr(self, "moe") else self.mlp
        return x + f(self.post_attention_layernorm(x))

    def forward(self, x, cos, sin, mask):
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.ffn(x + self.self_attn.out(o))


class MTPLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.enorm = GemmaRMSNorm(d, eps)
        self.hnorm = GemmaRMSNorm(d, eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.block = Block(cfg, moe=False)
        self.head_norm = GemmaRMSNorm(d, eps)
        self.head = nn.Linear(d, cfg["vocab_size"], bias=False)

    def fuse(self, emb, hid):
        return self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hid)], dim=-1))

    def logits(self, y):
        return self.head(self.head_norm(y))


def band(T: int, window: int | None, offset: int = 0) -> torch.Tensor:
    """Boolean [T, T]: query i (at position i + offset) sees key j at position j."""
    i = torch.arange(T)[:, None] + offset
    j = torch.arange(T)[None, :]
    m = j <= i
    return m & (i - j < window) if window else m


class TinyStep(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        n = cfg["num_hidden_layers"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Block(cfg, i in cfg["moe_layers"]) for i in range(n)])
        self.norm = GemmaRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.mtp = nn.ModuleList([MTPLayer(cfg) for _ in range(cfg["mtp_layers"])])
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def rope(self, positions):
        return base.rope_cos_sin(positions, self.cfg["head_dim"], self.cfg["rope_theta"])

    def window_of(self, layer_type: str, window_on: bool) -> int | None:
        return self.cfg["sliding_window"] if window_on and layer_type != "full_attention" else None

    def target(self, ids, window_on: bool = True):
        """Pre-norm hidden [B, T, D] (what vLLM hands to the drafter)."""
        T = ids.shape[1]
        cos, sin = self.rope(torch.arange(T))
        x = self.embed_tokens(ids)
        for layer, kind in zip(self.layers, LAYER_TYPES, strict=True):
            x = layer(x, cos, sin, band(T, self.window_of(kind, window_on)))
        return x

    def logits(self, h):
        return self.lm_head(self.norm(h))

    def draft_chain(self, ids, h, depth, window_on=True, keep=None):
        """Teacher-forced draft chain from every position.

        Returns ``depth`` tensors [B, T, D]: element ``s - 1`` at index ``j`` is the
        block output of draft step ``s`` of the chain started at position ``j``, which
        predicts token ``j + s + 1``; step ``s`` runs at position ``j + s - 1`` with
        input token ``j + s``. ``keep`` [B, T] (steps >= 2) marks the earlier cache
        slots that hold a written entry; the others are empty (zero key and value),
        as in vLLM, where those steps run only at the end of each round. ``None``
        keeps no earlier slot.
        """
        B, T = ids.shape
        emb = self.embed_tokens(ids)
        outs, prev = [], h
        for s in range(1, depth + 1):
            layer = self.mtp[s - 1]
            blk = layer.block
            e = torch.zeros_like(emb)
            e[:, : T - s] = emb[:, s:]
            cos, sin = self.rope(torch.arange(T) + (s - 1))
            x = layer.fuse(e, prev)
            q, k, v = blk.self_attn.qkv(blk.input_layernorm(x), cos, sin)
            win = self.window_of(LAYER_TYPES[(len(LAYER_TYPES) + s - 1) % 4], window_on)
            if s == 1:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=band(T, win))
            else:
                # Chain keys of earlier positions stand in for what earlier rounds wrote.
                kept = torch.zeros(B, T, dtype=torch.bool) if keep is None else keep
                km = kept[:, None, :, None].to(k.dtype)
                ke, ve = k * km, v * km
                scale = 1.0 / math.sqrt(k.shape[-1])
                sc = torch.matmul(q, ke.transpose(-1, -2)) * scale
                diag = (q * k).sum(-1) * scale
                eye = torch.eye(T, dtype=torch.bool)
                sc = torch.where(eye, diag[..., None], sc)
                sc = sc.masked_fill(~band(T, win), float("-inf"))
                p = torch.softmax(sc, dim=-1)
                o = torch.matmul(p, ve) + p.diagonal(dim1=-2, dim2=-1)[..., None] * (v - ve)
            y = blk.ffn(x + blk.self_attn.out(o))
            outs.append(y)
            prev = y
        return outs


# ------------------------------------------------------------------------------ losses


def target_loss(model, ids, lm, window_on):
    logits = model.logits(model.target(ids, window_on))
    return F.cross_entropy(logits[:, :-1][lm[:, 1:]], ids[:, 1:][lm[:, 1:]])


def draft_losses(model, ids, lm, h, depth, window_on, keep):
    T = ids.shape[1]
    out = []
    for s, y in enumerate(model.draft_chain(ids, h, depth, window_on, keep), start=1):
        n = T - s - 1
        lg = model.mtp[s - 1].logits(y[:, :n])
        m = lm[:, s + 1 :]
        out.append(F.cross_entropy(lg[m], ids[:, s + 1 :][m]))
    return out


# ----------------------------------------------------------------------- greedy checks


@torch.no_grad()
def greedy(model, prompts, max_new, eos_id, pad_id, window_on=True):
    seqs = [list(p) for p in prompts]
    done = [False] * len(seqs)
    for _ in range(max_new):
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s)
        lg = model.logits(model.target(ids, window_on))
        for b, s in enumerate(seqs):
            if not done[b]:
                nxt = int(lg[b, len(s) - 1].argmax())
                s.append(nxt)
                done[b] = nxt == eos_id
        if all(done):
            break
    return [s[len(p) :] for s, p in zip(seqs, prompts, strict=True)]


@torch.no_grad()
def simulated_acceptance(model, seqs, prompt_lens, depth):
    """Per-position acceptance as vLLM counts it, drafting round by round.

    Each round starts at the last accepted position ``j`` (token ``j + 1`` known);
    steps >= 2 see empty earlier cache slots (``keep=None``: a lower bound of what
    vLLM's partly written caches give). Returns (per-position rates, per-sequence AL).
    """
    L = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    outs = model.draft_chain(ids, model.target(ids), depth)
    preds = [model.mtp[s].logits(y).argmax(-1) for s, y in enumerate(outs)]
    acc, drafts, als = [0] * depth, 0, []
    for b, s in enumerate(seqs):
        j, n_drafts, n_acc = prompt_lens[b] - 1, 0, 0
        while j + 2 < len(s):
            n_drafts += 1
            run = 0
            for st in range(depth):
                if j + st + 2 < len(s) and int(preds[st][b, j]) == s[j + st + 2]:
                    run += 1
                    acc[st] += 1
                else:
                    break
            n_acc += run
            j += run + 1
        drafts += n_drafts
        als.append(1 + n_acc / max(n_drafts, 1))
    return [a / max(drafts, 1) for a in acc], als


# -------------------------------------------------------------------------------- save


def _checkpoint_name(key: str, n_layers: int) -> str:
    """The HF checkpoint name vLLM's Step3p5 loaders expect for a parameter."""
    if key.startswith("mtp."):
        i, rest = key[len("mtp.") :].split(".", 1)
        rest = rest.removeprefix("block.")
        if rest.startswith("head_norm."):
            rest = "shared_head.norm." + rest[len("head_norm.") :]
        elif rest.startswith("head."):
            rest = "shared_head.head." + rest[len("head.") :]
        return f"model.layers.{n_layers + int(i)}.{rest}"
    if key == "lm_head.weight":
        return key
    key = key.replace(".moe.share_expert.", ".share_expert.")
    for packed in ("gate_proj", "up_proj", "down_proj"):
        if key.endswith(f".moe.{packed}"):
            key += ".weight"
    return "model." + key


def save(model, cfg, tok, out: Path):
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    n = cfg["num_hidden_layers"]
    sd: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        sd[_checkpoint_name(k, n)] = v.detach().to(torch.float32).contiguous()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    ids = {t: tok.token_to_id(t) for t in base.SPECIAL}
    config = {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": n,
        "num_attention_heads": cfg["heads"],
        "num_attention_groups": cfg["kv_heads"],
        "head_dim": cfg["head_dim"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "max_seq_len": cfg["max_position_embeddings"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "att_impl_type": "GQA",
        "sliding_window": cfg["sliding_window"],
        # One entry per layer, the MTP layers included (they continue the pattern).
        "layer_types": [LAYER_TYPES[i % 4] for i in range(n + cfg["mtp_layers"])],
        "moe_layers_enum": ",".join(str(i) for i in cfg["moe_layers"]),
        "moe_num_experts": cfg["moe_num_experts"],
        "moe_top_k": cfg["moe_top_k"],
        "moe_intermediate_size": cfg["moe_intermediate_size"],
        "share_expert_dim": cfg["share_expert_dim"],
        "moe_router_activation": "softmax",
        "moe_router_scaling_factor": 1.0,
        "norm_expert_weight": True,
        "use_moe_router_bias": True,
        "need_fp32_gate": True,
        "use_head_wise_attn_gate": False,
        "num_nextn_predict_layers": cfg["mtp_layers"],
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    base.save_tokenizer(tok, out, cfg["max_position_embeddings"])


def load(path: Path) -> TinyStep:
    """The PyTorch twin of a saved model (for checks against vLLM)."""
    from safetensors.torch import load_file

    config = json.loads((path / "config.json").read_text())
    cfg = {
        "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"],
        "heads": config["num_attention_heads"],
        "kv_heads": config["num_attention_groups"],
        "head_dim": config["head_dim"],
        "num_hidden_layers": config["num_hidden_layers"],
        "intermediate_size": config["intermediate_size"],
        "moe_layers": [int(i) for i in config["moe_layers_enum"].split(",")],
        "moe_num_experts": config["moe_num_experts"],
        "moe_top_k": config["moe_top_k"],
        "moe_intermediate_size": config["moe_intermediate_size"],
        "share_expert_dim": config["share_expert_dim"],
        "rms_norm_eps": config["rms_norm_eps"],
        "rope_theta": config["rope_theta"],
        "sliding_window": config["sliding_window"],
        "max_position_embeddings": config["max_position_embeddings"],
        "mtp_layers": config["num_nextn_predict_layers"],
    }
    model = TinyStep(cfg)
    stored = load_file(str(path / "model.safetensors"))
    n = cfg["num_hidden_layers"]
    model.load_state_dict({k: stored[_checkpoint_name(k, n)] for k in model.state_dict()})
    return model.eval()


# -------------------------------------------------------------------------------- main


EVAL_DIGITS = (1, 5)  # workloads/arith-mix.jsonl: short sums (answerable directly) to long


def held_out_problems() -> list:
    """The shipped workload (``workloads/arith-mix.jsonl``), kept out of training."""
    lo, hi = EVAL_DIGITS
    return arith.make_problems(base.EVAL_N, base.EVAL_SEED, min_digits=lo, max_digits=hi)


def parse_args():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=HERE / "tiny-step")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=500, help="target training steps")
    ap.add_argument("--mtp-steps", type=int, default=500, help="drafter steps (frozen target)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--think-frac", type=float, default=0.7)
    ap.add_argument("--full-frac", type=float, default=0.5, help="batches with window off")
    ap.add_argument("--keep-frac", type=float, default=0.5, help="written cache slots, steps>=2")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--min-digits", type=int, default=1)
    ap.add_argument("--max-digits", type=int, default=5)
    ap.add_argument("--eval-n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--trunk-from", type=Path, help="skip the target phase: take it from this saved model"
    )
    return ap.parse_args()


def cosine(step, total, lr, warmup):
    if step < warmup:
        return lr * (step + 1) / warmup
    prog = (step - warmup) / max(1, total - warmup)
    return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * prog)))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    t0 = time.time()
    tok = base.build_tokenizer()
    cfg = {
        "vocab_size": ((tok.get_vocab_size() + 7) // 8) * 8,
        "hidden_size": 128,
        "heads": 2,
        "kv_heads": 2,  # vLLM's Step3p5 loader asserts num_attention_groups > 1
        "head_dim": 64,  # the CPU attention kernel rejects head_dim 16
        "num_hidden_layers": 4,
        "intermediate_size": 384,
        "moe_layers": [3],  # Step3p5ForCausalLM asserts at least one MoE layer
        "moe_num_experts": 4,
        "moe_top_k": 2,
        "moe_intermediate_size": 128,
        "share_expert_dim": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "sliding_window": args.window,
        "max_position_embeddings": 512,
        "mtp_layers": 3,
    }
    pad_id, eos_id = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    held_out = held_out_problems()
    exclude = {arith.parse_operands(p.prompt) for p in held_out}
    model = TinyStep(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params: {n_params / 1e6:.2f}M cfg={cfg}", flush=True)

    def batches(offset):
        chunk = 0
        while True:
            probs = arith.make_problems(
                args.batch,
                args.seed * 1000 + offset + chunk,
                min_digits=args.min_digits,
                max_digits=args.max_digits,
                exclude=exclude,
            )
            chunk += 1
            exs = [base.encode_example(tok, p, rng.random() < args.think_frac) for p in probs]
            yield (*base.make_batch(exs, pad_id), rng.random() >= args.full_frac)

    def train(params, steps, lr, loss_fn, label, offset):
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
        stream, ema = batches(offset), None
        for step in range(steps):
            ids, lm, window_on = next(stream)
            parts = loss_fn(ids, lm, window_on)
            for g in opt.param_groups:
                g["lr"] = cosine(step, steps, lr, args.warmup)
            opt.zero_grad(set_to_none=True)
            sum(parts).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            vals = [x.item() for x in parts]
            ema = (
                vals if ema is None else [0.9 * a + 0.1 * b for a, b in zip(ema, vals, strict=True)]
            )
            if step % 50 == 0 or step == steps - 1:
                el = time.time() - t0
                losses = " ".join(f"{x:.3f}" for x in ema)
                print(f"{label} {step:4d} loss {losses} T={ids.shape[1]} {el:5.0f}s", flush=True)

    trunk = [p for n, p in model.named_parameters() if not n.startswith("mtp.")]
    if args.trunk_from:
        trained = load(args.trunk_from)
        model.load_state_dict(
            {k: v for k, v in trained.state_dict().items() if not k.startswith("mtp.")},
            strict=False,
        )
        print(f"target loaded from {args.trunk_from}", flush=True)
    else:
        train(
            trunk, args.steps, args.lr, lambda i, m, w: [target_loss(model, i, m, w)], "target", 0
        )
    # The drafter phase has its own seeds: retraining it on a saved target
    # (--trunk-from) gives the same weights as a full run.
    torch.manual_seed(args.seed + 1)
    rng.seed(args.seed + 1)

    for p in trunk:
        p.requires_grad_(False)
    drafter = list(model.mtp.parameters())

    def drafter_loss(ids, lm, window_on):
        with torch.no_grad():
            h = model.target(ids, window_on)
        keep = torch.rand(ids.shape) < args.keep_frac
        return draft_losses(model, ids, lm, h, 3, window_on, keep)

    train(drafter, args.mtp_steps, args.mtp_lr, drafter_loss, "mtp", 10**6)
    print(f"training done in {time.time() - t0:.0f}s", flush=True)

    model.eval()
    save(model, cfg, tok, args.out)
    base.check_hf_tokenizer(args.out, tok)
    evaluate(model, tok, held_out[: args.eval_n], eos_id, pad_id)
    print(f"total time {time.time() - t0:.0f}s", flush=True)


def evaluate(model, tok, problems, eos_id, pad_id):
    for thinking in (True, False):
        for window_on in (True, False):
            prompts = [
                tok.encode(base.render_prompt(p.prompt, thinking), add_special_tokens=False).ids
                for p in problems
            ]
            outs = greedy(model, prompts, 300 if thinking else 16, eos_id, pad_id, window_on)
            texts = [tok.decode([t for t in o if t != eos_id]) for o in outs]
            acc = sum(arith.score(t, p.answer) for t, p in zip(texts, problems, strict=True))
            line = (
                f"eval thinking={thinking} window={window_on}: accuracy {acc / len(problems):.3f}"
            )
            if window_on:
                rates, als = simulated_acceptance(
                    model,
                    [p + o for p, o in zip(prompts, outs, strict=True)],
                    [len(p) for p in prompts],
                    3,
                )
                mean = sum(als) / len(als)
                sd = (sum((a - mean) ** 2 for a in als) / len(als)) ** 0.5
                line += " sim. per-pos " + " ".join(f"{r:.2f}" for r in rates)
                line += f" AL {mean:.2f} sd {sd:.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
