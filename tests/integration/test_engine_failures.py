"""A real engine that refuses its configuration fails its cell fast, in its own words."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from farm.engines import job_capabilities
from farm.plan import expand_matrix
from farm.records import BuildInfo
from farm.runner import CellTask, run_cell
from farm.spec import JobSpec, TimeoutSpec
from farm.workload.prompts import load_workload

pytestmark = pytest.mark.engine


def test_max_model_len_beyond_the_model_fails_fast_with_the_engines_error(
    local_job: JobSpec, engine_build: BuildInfo, tmp_path: Path
) -> None:
    # models/tiny-step has max_position_embeddings 512: vLLM refuses 4096 at start.
    model = local_job.models[0].model_copy(update={"max_model_len": 4096})
    job = local_job.model_copy(
        update={
            "models": (model,),
            "axes": local_job.axes.model_copy(
                update={
                    "graph_mode": ("eager",),
                    "mtp_depth": (1,),
                    "sliding_window": ("on",),
                    "thinking": ("off",),
                }
            ),
        }
    )
    (cell,) = expand_matrix(job, job_capabilities(job)).cells
    startup_timeout = 600.0
    task = CellTask(
        cell=cell,
        engine=job.engines[0],
        model=model,
        model_path=str(job.resolve(model.path)),
        workloads=tuple(load_workload(w, job.resolve) for w in job.workloads),
        build=engine_build,
        timeouts=TimeoutSpec(startup_s=startup_timeout, stop_s=10),
        log_dir=str(tmp_path),
    )
    t0 = time.monotonic()
    result = run_cell(task)
    elapsed = time.monotonic() - t0
    assert result.status == "failed"
    assert elapsed < startup_timeout / 4, elapsed
    assert result.error is not None and result.error.startswith("EngineError: engine exited")
    # The engine's own line, not only an exit code: the limit it refused and why.
    assert "max_model_len" in result.error and "4096" in result.error, result.error
    assert "devices not released" not in result.error
    assert result.variants == () and result.startup_s is None
    assert result.log_tail and "4096" in result.log_tail
    assert result.log_path and Path(result.log_path).is_file()
