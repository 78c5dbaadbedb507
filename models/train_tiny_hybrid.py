#!/usr/bin/env python
"""Train the embedded Qwen3-Next-shaped hybrid model (``models/tiny-hybrid``) on CPU.

The model has seed 2's shape (a Qwen3.x GDN hybrid with MTP; docs/design.md, "What the
CPU engine can serve"): a ``Qwen3NextForCausalLM``
whose layers mix Gated DeltaNet linear attention with gated full attention 3:1
(``linear, linear, linear, full``, as Qwen3-Next), MoE in every layer, one MTP layer
(``num_nextn_predict_layers: 1``), bf16 weights, served by vLLM with
``--speculative-config '{"method": "mtp", "num_speculative_tokens": N}'``.
Qwen3-Next rather than the dense Qwen3.5: vLLM 0.32.0's ``qwen3_5.py`` imports
``qwen3_vl.py``, which imports transformers' Qwen2-VL image processor, which imports
torchvision, which the farm's CPU build removes (its PyPI wheel does not load on CPU
torch 2.13), so ``Qwen3_5ForCausalLM`` "failed to be inspected" there.

The PyTorch model below re-implements what vLLM 0.32.0 computes
(``vllm/model_executor/models/qwen3_next.py``, ``qwen3_next_mtp.py``,
``layers/mamba/gdn/qwen_gdn_linear_attn.py`` ``forward_cpu``,
``layers/mamba/ops/cpu/gdn_attention.py``, ``v1/spec_decode/llm_base_proposer.py``):

* GDN layer: ``in_proj_qkvz`` / ``in_proj_ba`` in Qwen3-Next's interleaved layout ->
  q, k, v through a depthwise causal conv1d (width 4, no bias) and SiLU; z the output
  gate; ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``; q and k
  L2-normalised, q scaled by ``d_k^-0.5``; the gated delta rule ``S_t = e^{g_t} S_{t-1}
  + k_t beta_t (v_t - e^{g_t} S_{t-1}^T k_t)^T``, ``o_t = S_t^T q_t``; then
  ``RMSNormGated`` (plain weight, norm before the SiLU gate of z) and ``out_proj``.
  Training runs the chunked (WY) form of the same rule, checked against the per-token
  recurrence (``--self-test``).
* full attention (``Qwen3NextAttention``): ``q_proj`` gives per head ``[q, gate]``,
  Gemma-style q/k norms, neox RoPE on the first quarter of each head
  (``partial_rotary_factor: 0.25``), causal softmax attention, output times
  ``sigmoid(gate)``, ``o_proj``.
* pre-norm blocks with Gemma RMS norms (``x * (1 + w)``) and ``Qwen3NextSparseMoeBlock``
  (below); the hidden state handed to the drafter is the final-normed one
  (``Qwen3NextModel.forward`` returns ``norm(x)``), unlike Step-3.5's pre-norm hand-off.
* drafter (``Qwen3NextMultiTokenPredictor``): ``fc(cat[pre_fc_norm_embedding(embed(
  token)), pre_fc_norm_hidden(hidden)])``, one gated full-attention MoE decoder layer,
  ``mtp.norm``, the target's ``lm_head`` and ``embed_tokens`` (loaded from the same
  checkpoint names). The one layer serves every draft step; step ``s`` feeds on the
  previous step's normed output. vLLM's proposer runs step 1 over every position (its
  KV cache complete) and steps 2.. once per round at the round's last positions, so
  step ``s`` at chain start ``j`` (position ``j + s - 1``) attends to step 1's keys at
  positions ``<= j`` and to the chain's own keys at ``j + 1 .. j + s - 1``: training
  shows it exactly that.

Training is in two phases, as for ``tiny-step``: the target alone (``--steps``), then
the MTP layer on the frozen target (``--mtp-steps``, a budget short of convergence, so
the drafter is weaker than the target the way real MTP heads are). The task, tokenizer
and chat template are ``train_tiny_mtp.py``'s, the held-out workload
``workloads/arith-mix.jsonl`` is excluded from training.

Usage (CPU)::

    python models/train_tiny_hybrid.py --out models/tiny-hybrid

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

import train_tiny_step as step  # noqa: E402  (norms, MLP, greedy, acceptance, schedule)

base = step.base  # tokenizer, chat template, task, batches
arith = base.arith

LAYER_PATTERN = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
held_out_problems = step.held_out_problems  # workloads/arith-mix.jsonl, kept out of training
CHUNK = 64  # chunk length of the training-time delta rule (FLA's and vLLM's default)


# ------------------------------------------------------------------------ GDN layer


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """FLA's l2norm (``use_qk_l2norm_in_kernel``): x / sqrt(sum x^2 + eps)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def delta_rule_recurrent(q, k, v, g, beta):
    """Per-token gated delta rule; q, k [B, T, H, dk], v [B, T, H, dv], g, beta [B, T, H].

    The reference the chunked form is checked against (``--self-test``); q already
    normalised and scaled.
    """
    B, T, H, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kv_mem = (S * k[:, t, :, :, None]).sum(-2)
        delta = (v[:, t] - kv_mem) * beta[:, t, :, None]
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        out.append((S * q[:, t, :, :, None]).sum(-2))
    return torch.stack(out, dim=1)


def delta_rule_chunked(q, k, v, g, beta, chunk: int = CHUNK):
    """The same rule in chunked WY form (as FLA's ``chunk_gated_delta_rule``).

    Within a chunk the delta-rule corrections solve a unit lower-triangular system,
    done with ``solve_triangular`` so autograd needs no in-place loop; across chunks
    the state is carried as in the recurrence.
    """
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - T % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (T + pad) // chunk
    # [B, H, n, C, d]
    q, k, v = (x.transpose(1, 2).reshape(B, H, n, chunk, -1) for x in (q, k, v))
    g, beta = (x.transpose(1, 2).reshape(B, H, n, chunk) for x in (g, beta))
    gc = g.cumsum(-1)
    lower = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool))
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~lower, 0).exp() * lower
    kb = k * beta[..., None]
    strict = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool), diagonal=-1)
    m = (kb @ k.transpose(-1, -2)) * decay * strict
    eye = torch.eye(chunk, dtype=q.dtype)
    tinv = torch.linalg.solve_triangular(eye + m, eye.expand_as(m), upper=False)
    u = tinv @ (v * beta[..., None])  # corrected values
    w = tinv @ (kb * gc.exp()[..., None])  # their dependence on the incoming state
    intra = (q @ k.transpose(-1, -2)) * decay
    S = q.new_zeros(B, H, dk, dv)
    outs = []
    for c in range(n):
        v_new = u[:, :, c] - w[:, :, c] @ S
        outs.append((q[:, :, c] * gc[:, :, c, :, None].exp()) @ S + intra[:, :, c] @ v_new)
        g_last = gc[:, :, c, -1]
        k_dec = k[:, :, c] * (g_last[..., None] - gc[:, :, c]).exp()[..., None]
        S = S * g_last.exp()[..., None, None] + k_dec.transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(B, H, n * chunk, dv)[:, :, :T]
    return o.transpose(1, 2)


class GatedDeltaNet(nn.Module):
    """``QwenGatedDeltaNetAttention`` with Qwen3-Next's interleaved projection layout."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.hk, self.hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        self.dk, self.dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        conv_dim = 2 * self.key_dim + self.value_dim
        # Qwen3-Next's fused projections, interleaved by key-head group:
        # qkvz per group [q (dk), k (dk), v (r * dv), z (r * dv)], ba per group
        # [b (r), a (r)], r = value heads per key head (``fix_query_key_value_ordering``).
        self.in_proj_qkvz = nn.Linear(d, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(d, 2 * self.hv, bias=False)
        width = cfg["linear_conv_kernel_dim"]
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, width, groups=conv_dim, bias=False)
        # Qwen3-Next's init: A in [1, 16) as log, dt so that softplus(dt_bias) spans
        # [1e-3, 1e-1]; the gate then starts with slow to fast decays across heads.
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, self.hv)))
        dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), self.hv))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.norm_weight = nn.Parameter(torch.ones(self.dv))
        self.eps = cfg["rms_norm_eps"]
        self.out_proj = nn.Linear(self.value_dim, d, bias=False)

    def forward(self, x, chunked: bool = True):
        B, T, _ = x.shape
        r = self.hv // self.hk
        qkvz = self.in_proj_qkvz(x).view(B, T, self.hk, -1)
        q, k, v, z = qkvz.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        b, a = self.in_proj_ba(x).view(B, T, self.hk, 2 * r).split([r, r], dim=-1)
        qkv = torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], dim=-1).transpose(1, 2)
        qkv = F.silu(self.conv1d(F.pad(qkv, (self.conv1d.kernel_size[0] - 1, 0))))
        qkv = qkv.transpose(1, 2)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(B, T, self.hk, self.dk)) * self.dk**-0.5
        k = l2norm(k.reshape(B, T, self.hk, self.dk))
        v = v.reshape(B, T, self.hv, self.dv)
        if r != 1:
            q = q.repeat_interleave(r, dim=2)
            k = k.repeat_interleave(r, dim=2)
        beta = torch.sigmoid(b.reshape(B, T, self.hv))
        g = -self.A_log.exp() * F.softplus(a.reshape(B, T, self.hv) + self.dt_bias)
        rule = delta_rule_chunked if chunked else delta_rule_recurrent
        o = rule(q, k, v, g, beta)  # [B, T, Hv, dv]
        z = z.reshape(B, T, self.hv, self.dv)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight
        return self.out_proj((o * F.silu(z)).reshape(B, T, self.value_dim))


# ------------------------------------------------------------------- full attention


class GatedAttention(nn.Module):
    """``Qwen3NextAttention``: output-gated, q/k Gemma norms, partial neox RoPE."""

    def __init__(self, cfg):
        super().__init__()
        d, h, kv, hd = (
            cfg["hidden_size"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
            cfg["head_dim"],
        )
        self.h, self.kv, self.hd = h, kv, hd
        self.rot = int(hd * cfg["partial_rotary_factor"])
        self.q_proj = nn.Linear(d, h * hd * 2, bias=False)  # per head: [q, gate]
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.q_norm = step.GemmaRMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = step.GemmaRMSNorm(hd, cfg["rms_norm_eps"])

    def _rope(self, x, cos, sin):
        r = self.rot
        return torch.cat([base.apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def qkv(self, x, cos, sin):
        """q, k, v [B, H, T, hd] after norms and RoPE, and the gate [B, T, H * hd]."""
        B, T, _ = x.shape
        q, gate = self.q_proj(x).view(B, T, self.h, 2 * self.hd).chunk(2, dim=-1)
        q = self._rope(self.q_norm(q).transpose(1, 2), cos, sin)
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv, self.hd)).transpose(1, 2)
        k = self._rope(k, cos, sin)
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        if self.kv != self.h:
            k = k.repeat_interleave(self.h // self.kv, dim=1)
            v = v.repeat_interleave(self.h // self.kv, dim=1)
        return q, k, v, gate.reshape(B, T, self.h * self.hd)

    def out(self, o, gate):
        B, H, T, hd = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * hd) * torch.sigmoid(gate))


class SparseMoe(nn.Module):
    """``Qwen3NextSparseMoeBlock``: softmax top-k routing (renormalised, ``norm_topk_prob``)
    over SiLU experts, plus a shared expert scaled by ``sigmoid(shared_expert_gate(x))``.

    Every layer is MoE, as in Qwen3-Next (``decoder_sparse_step: 1``); vLLM's
    ``Qwen3NextForCausalLM`` and ``Qwen3NextMTP`` both raise without an MoE layer.
    """

    def __init__(self, cfg):
        super().__init__()
        d, e, i = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"]
        self.top_k = cfg["num_experts_per_tok"]
        self.gate = nn.Linear(d, e, bias=False)
        self.experts = nn.ModuleList([step.MLP(d, i) for _ in range(e)])
        self.shared_expert = step.MLP(d, cfg["shared_expert_intermediate_size"])
        self.shared_expert_gate = nn.Linear(d, 1, bias=False)

    def forward(self, x):
        top = torch.topk(self.gate(x), self.top_k, dim=-1)
        w = torch.softmax(top.values, dim=-1)  # = softmax over all, top k, renormalised
        route = torch.zeros(*x.shape[:-1], len(self.experts)).scatter(-1, top.indices, w)
        y = torch.stack([expert(x) for expert in self.experts], dim=-1)  # [..., d, E]
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return (y * route[..., None, :]).sum(-1) + shared


class Block(nn.Module):
    def __init__(self, cfg, layer_type: str):
        super().__init__()
        d, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.layer_type = layer_type
        self.input_layernorm = step.GemmaRMSNorm(d, eps)
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.post_attention_layernorm = step.GemmaRMSNorm(d, eps)
        self.mlp = SparseMoe(cfg)

    def ffn(self, x):
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, cos, sin, chunked=True):
        hn = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            return self.ffn(x + self.linear_attn(hn, chunked))
        q, k, v, gate = self.self_attn.qkv(hn, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.ffn(x + self.self_attn.out(o, gate))


class MTP(nn.Module):
    """``Qwen3NextMultiTokenPredictor`` with one layer (checkpoint prefix ``mtp.``)."""

    def __init__(self, cfg):
        super().__init__()
        d, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.pre_fc_norm_embedding = step.GemmaRMSNorm(d, eps)
        self.pre_fc_norm_hidden = step.GemmaRMSNorm(d, eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList([Block(cfg, "full_attention")])
        self.norm = step.GemmaRMSNorm(d, eps)

    def fuse(self, emb, hid):
        return self.fc(
            torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hid)], -1)
        )


class TinyHybrid(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.layer_types = cfg["layer_types"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Block(cfg, t) for t in self.layer_types])
        self.norm = step.GemmaRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.mtp = MTP(cfg)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            elif isinstance(m, nn.Conv1d):
                nn.init.normal_(m.weight, std=1.0 / math.sqrt(m.kernel_size[0]))

    def rope(self, positions):
        rot = int(self.cfg["head_dim"] * self.cfg["partial_rotary_factor"])
        return base.rope_cos_sin(positions, rot, self.cfg["rope_theta"])

    def target(self, ids, window_on: bool = True, chunked: bool = True):
        """Final-normed hidden [B, T, D]: what vLLM hands to the drafter.

        ``window_on`` is accepted for the shared greedy helper and ignored (no window).
        """
        cos, sin = self.rope(torch.arange(ids.shape[1]))
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, chunked)
        return self.norm(x)

    def logits(self, h):
        return self.lm_head(h)

    def draft_chain(self, ids, h, depth, window_on=True, keep=None):
        """Teacher-forced draft chain from every position, as vLLM's proposer runs it.

        Returns ``depth`` normed outputs [B, T, D]: element ``s - 1`` at index ``j`` is
        draft step ``s`` of the chain started at position ``j`` (position ``j + s - 1``,
        input token ``j + s``), which predicts token ``j + s + 1`` through ``lm_head``.
        Step 1 attends causally over step 1's own keys; step ``s >= 2`` over step 1's
        keys at positions ``<= j`` plus the chain's keys of steps 2..s at ``j``.
        ``window_on`` and ``keep`` exist for ``train_tiny_step``'s helpers and are unused.
        """
        T = ids.shape[1]
        emb = self.embed_tokens(ids)
        blk = self.mtp.layers[0]
        attn = blk.self_attn
        scale = attn.hd**-0.5
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        outs, prev, k1, v1, chain = [], h, None, None, []
        for s in range(1, depth + 1):
            e = torch.zeros_like(emb)
            e[:, : T - s] = emb[:, s:]
            cos, sin = self.rope(torch.arange(T) + (s - 1))
            x = self.mtp.fuse(e, prev)
            q, k, v, gate = attn.qkv(blk.input_layernorm(x), cos, sin)
            if s == 1:
                k1, v1 = k, v
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                chain.append((k, v))
                main = (q @ k1.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
                extra = torch.stack([(q * kc).sum(-1) * scale for kc, _ in chain], dim=-1)
                p = torch.softmax(torch.cat([main, extra], dim=-1), dim=-1)
                o = p[..., :T] @ v1
                for i, (_, vc) in enumerate(chain):
                    o = o + p[..., T + i, None] * vc
            y = self.mtp.norm(blk.ffn(x + attn.out(o, gate)))
            outs.append(y)
            prev = y
        return outs


class _StepView:
    """What ``train_tiny_step.simulated_acceptance`` asks of a model: one head per step.

    Qwen3.5's single MTP layer drafts every step through the target's ``lm_head``.
    """

    class _Head:
        def __init__(self, model):
            self.logits = model.logits

    def __init__(self, model: TinyHybrid, depth: int):
        self.target = model.target
        self.draft_chain = model.draft_chain
        self.mtp = [self._Head(model)] * depth


# -------------------------------------------------------------------------- losses


def target_loss(model, ids, lm):
    logits = model.logits(model.target(ids))
    return F.cross_entropy(logits[:, :-1][lm[:, 1:]], ids[:, 1:][lm[:, 1:]])


def draft_losses(model, ids, lm, h, depth):
    T = ids.shape[1]
    out = []
    for s, y in enumerate(model.draft_chain(ids, h, depth), start=1):
        n = T - s - 1
        lg = model.logits(y[:, :n])
        m = lm[:, s + 1 :]
        out.append(F.cross_entropy(lg[m], ids[:, s + 1 :][m]))
    return out


# ---------------------------------------------------------------------------- save


def _checkpoint_name(key: str) -> str:
    """The HF checkpoint name vLLM's Qwen3-Next loaders expect for a parameter."""
    key = key.replace(".linear_attn.norm_weight", ".linear_attn.norm.weight")
    if key.startswith("mtp."):
        return key
    if key == "lm_head.weight":
        return key
    return "model." + key


def text_config(cfg, tok) -> dict:
    ids = {t: tok.token_to_id(t) for t in base.SPECIAL}
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["moe_intermediate_size"],  # unused: every layer is MoE
        "num_experts": cfg["num_experts"],
        "num_experts_per_tok": cfg["num_experts_per_tok"],
        "moe_intermediate_size": cfg["moe_intermediate_size"],
        "shared_expert_intermediate_size": cfg["shared_expert_intermediate_size"],
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": len(cfg["layer_types"]),
        "layer_types": cfg["layer_types"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "attn_output_gate": True,
        "linear_conv_kernel_dim": cfg["linear_conv_kernel_dim"],
        "linear_key_head_dim": cfg["linear_key_head_dim"],
        "linear_value_head_dim": cfg["linear_value_head_dim"],
        "linear_num_key_heads": cfg["linear_num_key_heads"],
        "linear_num_value_heads": cfg["linear_num_value_heads"],
        "hidden_act": "silu",
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg["rope_theta"],
            "partial_rotary_factor": cfg["partial_rotary_factor"],
        },
        "max_position_embeddings": cfg["max_position_embeddings"],
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": "bfloat16",
    }


def save(model, cfg, tok, out: Path):
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = {}
    for k, v in model.state_dict().items():
        # A_log stays fp32 as vLLM keeps it (its parameter is created float32).
        dtype = torch.float32 if k.endswith("A_log") else torch.bfloat16
        sd[_checkpoint_name(k)] = v.detach().to(dtype).contiguous()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(text_config(cfg, tok), indent=2) + "\n")
    base.save_tokenizer(tok, out, cfg["max_position_embeddings"])


def config_from_file(config: dict) -> dict:
    return {
        "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"],
        "num_experts": config["num_experts"],
        "num_experts_per_tok": config["num_experts_per_tok"],
        "moe_intermediate_size": config["moe_intermediate_size"],
        "shared_expert_intermediate_size": config["shared_expert_intermediate_size"],
        "layer_types": config["layer_types"],
        "num_attention_heads": config["num_attention_heads"],
        "num_key_value_heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "linear_conv_kernel_dim": config["linear_conv_kernel_dim"],
        "linear_key_head_dim": config["linear_key_head_dim"],
        "linear_value_head_dim": config["linear_value_head_dim"],
        "linear_num_key_heads": config["linear_num_key_heads"],
        "linear_num_value_heads": config["linear_num_value_heads"],
        "rms_norm_eps": config["rms_norm_eps"],
        "rope_theta": config["rope_parameters"]["rope_theta"],
        "partial_rotary_factor": config["rope_parameters"]["partial_rotary_factor"],
        "max_position_embeddings": config["max_position_embeddings"],
    }


def load(path: Path) -> TinyHybrid:
    """The PyTorch twin (fp32, from the shipped bf16 weights) of a saved model."""
    from safetensors.torch import load_file

    model = TinyHybrid(config_from_file(json.loads((path / "config.json").read_text())))
    stored = load_file(str(path / "model.safetensors"))
    model.load_state_dict(
        {k: stored[_checkpoint_name(k)].to(torch.float32) for k in model.state_dict()}
    )
    return model.eval()


# ---------------------------------------------------------------------------- main


def parse_args():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=HERE / "tiny-hybrid")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=400, help="target training steps")
    ap.add_argument("--mtp-steps", type=int, default=120, help="drafter steps (frozen target)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--think-frac", type=float, default=0.7)
    ap.add_argument("--min-digits", type=int, default=1)
    ap.add_argument("--max-digits", type=int, default=5)
    ap.add_argument("--eval-n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--trunk-from", type=Path, help="skip the target phase: take it from this saved model"
    )
    ap.add_argument(
        "--self-test", action="store_true", help="check the chunked rule against the recurrence"
    )
    return ap.parse_args()


def default_config(tok) -> dict:
    return {
        "vocab_size": ((tok.get_vocab_size() + 7) // 8) * 8,
        "hidden_size": 128,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 256,
        "layer_types": LAYER_PATTERN,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,  # the CPU attention kernel rejects head_dim 16
        "linear_conv_kernel_dim": 4,  # the packed CPU conv kernel wants width 4
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": 512,
    }


def self_test() -> None:
    torch.manual_seed(0)
    B, T, H, d = 2, 150, 2, 16
    q = l2norm(torch.randn(B, T, H, d, dtype=torch.float64)) * d**-0.5
    k = l2norm(torch.randn(B, T, H, d, dtype=torch.float64))
    v = torch.randn(B, T, H, d, dtype=torch.float64)
    g = -torch.rand(B, T, H, dtype=torch.float64)
    beta = torch.rand(B, T, H, dtype=torch.float64)
    ref = delta_rule_recurrent(q, k, v, g, beta)
    got = delta_rule_chunked(q, k, v, g, beta)
    print(f"self-test: chunked vs recurrent max |diff| {(ref - got).abs().max():.2e}")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.self_test:
        self_test()
        return
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    t0 = time.time()
    tok = base.build_tokenizer()
    cfg = default_config(tok)
    pad_id, eos_id = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    held_out = step.held_out_problems()
    exclude = {arith.parse_operands(p.prompt) for p in held_out}
    model = TinyHybrid(cfg)
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
            yield base.make_batch(exs, pad_id)

    def train(params, steps, lr, loss_fn, label, offset):
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
        stream, ema = batches(offset), None
        for i in range(steps):
            ids, lm = next(stream)
            parts = loss_fn(ids, lm)
            for grp in opt.param_groups:
                grp["lr"] = step.cosine(i, steps, lr, args.warmup)
            opt.zero_grad(set_to_none=True)
            sum(parts).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            vals = [x.item() for x in parts]
            ema = (
                vals if ema is None else [0.9 * a + 0.1 * b for a, b in zip(ema, vals, strict=True)]
            )
            if i % 50 == 0 or i == steps - 1:
                losses = " ".join(f"{x:.3f}" for x in ema)
                print(
                    f"{label} {i:4d} loss {losses} T={ids.shape[1]} {time.time() - t0:5.0f}s",
                    flush=True,
                )

    trunk = [p for n, p in model.named_parameters() if not n.startswith("mtp.")]
    if args.trunk_from:
        trained = load(args.trunk_from)
        model.load_state_dict(
            {k: v for k, v in trained.state_dict().items() if not k.startswith("mtp.")},
            strict=False,
        )
        print(f"target loaded from {args.trunk_from}", flush=True)
    else:
        train(trunk, args.steps, args.lr, lambda i, m: [target_loss(model, i, m)], "target", 0)
    t_target = time.time() - t0
    # The drafter phase has seeds of its own. --trunk-from starts from the shipped bf16
    # target, a full run from its fp32 weights: the drafters differ by that rounding.
    torch.manual_seed(args.seed + 1)
    rng.seed(args.seed + 1)
    for p in trunk:
        p.requires_grad_(False)

    def drafter_loss(ids, lm):
        with torch.no_grad():
            h = model.target(ids)
        return draft_losses(model, ids, lm, h, 3)

    train(list(model.mtp.parameters()), args.mtp_steps, args.mtp_lr, drafter_loss, "mtp", 10**6)
    print(f"training done in {time.time() - t0:.0f}s (target {t_target:.0f}s)", flush=True)

    model.eval()
    save(model, cfg, tok, args.out)
    base.check_hf_tokenizer(args.out, tok)
    evaluate(load(args.out), tok, held_out[: args.eval_n], eos_id, pad_id)
    print(f"total time {time.time() - t0:.0f}s", flush=True)


def evaluate(model, tok, problems, eos_id, pad_id):
    """Greedy accuracy of the shipped (bf16-rounded) weights and simulated acceptance."""
    for thinking in (True, False):
        prompts = [
            tok.encode(base.render_prompt(p.prompt, thinking), add_special_tokens=False).ids
            for p in problems
        ]
        outs = step.greedy(model, prompts, 300 if thinking else 16, eos_id, pad_id)
        texts = [tok.decode([t for t in o if t != eos_id]) for o in outs]
        acc = sum(arith.score(t, p.answer) for t, p in zip(texts, problems, strict=True))
        rates, als = step.simulated_acceptance(
            _StepView(model, 3),
            [p + o for p, o in zip(prompts, outs, strict=True)],
            [len(p) for p in prompts],
            3,
        )
        mean = sum(als) / len(als)
        sd = (sum((a - mean) ** 2 for a in als) / len(als)) ** 0.5
        print(
            f"eval thinking={thinking}: accuracy {acc / len(problems):.3f} sim. per-pos "
            + " ".join(f"{r:.2f}" for r in rates)
            + f" AL {mean:.2f} sd {sd:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
