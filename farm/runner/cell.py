"""Run one server-level cell: start the engine, run each variant, stop the engine.

This is the I/O edge around an engine server: the adapter's engine process on a
free loopback port (``farm.runner.lifecycle``), HTTP to its OpenAI API and metrics
(``farm.runner.variants``), a log per cell. A start-up that prints a known fatal
error fails fast with the engine's own line; a stop waits until the devices are
released, so the next cell on the node finds them free.

Whatever the engine does, the cell ends with a result, never an exception out of
the Ray task: a variant none of whose requests succeeded, or whose counters cannot
be used, fails the cell with the cause (the variants measured so far are kept),
and a cell that runs past its deadline (``cell_deadline_s``) is stopped.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from farm.analysis.prefix_cache import is_hybrid_config
from farm.engines import EngineAdapter, EngineProcess, adapter_for
from farm.engines.base import EngineOutputError
from farm.errors import CellError, EngineError
from farm.paths import farm_home
from farm.plan import Variant
from farm.records import CellResult, EffectiveConfig, VariantResult
from farm.runner.lifecycle import StartedEngine, start_engine, stop_engine
from farm.runner.pd import prefill_log_path
from farm.runner.positions import serving_folder
from farm.runner.task import CellTask
from farm.runner.variants import VariantRun, harness_python, run_variant

__all__ = ["cell_deadline_s", "run_cell"]

_LOG_TAIL_LINES = 40
# GET /v1/models after start-up: the engine answers at once or not at all.
_MODELS_TIMEOUT_S = 30.0
# Two metrics scrapes around each variant (farm.runner.variants._SCRAPE_TIMEOUT_S).
_SCRAPES_S = 60.0


class _DeadlinePassed(Exception):
    """The cell ran past its deadline."""


def cell_deadline_s(task: CellTask) -> float:
    """How long the cell may run from its start to the end of its last variant.

    ``timeouts.cell_s`` when the job sets it; otherwise the sum of what the other
    limits allow: start-up, the model listing, and per variant two metrics scrapes
    plus its harness's ``timeout_s`` or ``request_s`` for each round of
    ``concurrency`` requests. A cell whose every request answers within its own
    timeout never meets this default; it stops what waits outside those timeouts.
    """
    explicit = task.timeouts.cell_s
    if explicit is not None:
        return explicit
    workloads = {w.spec.name: w for w in task.workloads}
    budget = task.timeouts.startup_s + _MODELS_TIMEOUT_S
    for variant in task.cell.variants:
        workload = workloads.get(variant.workload)
        if workload is None:
            continue
        spec = workload.spec
        if spec.harness is not None:
            budget += _SCRAPES_S + spec.harness.timeout_s
        else:
            # A conversation's turns go one after another: its length in rounds.
            longest = max((1 + len(p.turns) for p in workload.prompts), default=1)
            rounds = math.ceil(len(workload.prompts) / max(spec.concurrency, 1)) * longest
            budget += _SCRAPES_S + rounds * task.timeouts.request_s
    return budget


def run_cell(task: CellTask, npu_ids: tuple[int, ...] = (), node: str | None = None) -> CellResult:
    """Run ``task`` and return its result; never raises for an engine failure.

    A failure (engine exits, start-up timeout, server dies mid-variant, a variant
    whose requests all failed or whose counters are unusable, the cell deadline)
    yields a result with status ``failed``, the error, the log tail, and every
    variant that was measured before it. An error in the farm's own code also
    yields a failed result, naming where it was raised.
    """
    if task.build is None:
        raise CellError(f"cell {task.cell.cell_id} was sent to run without an engine build")
    python = task.build.python
    adapter = adapter_for(task.cell.family)
    started = datetime.now(UTC)
    log_path = _fresh_log(task)
    done = _Progress()
    startup_s = generation_s = None
    effective = None
    t0 = time.monotonic()
    deadline_s = cell_deadline_s(task)
    start: StartedEngine | None = None
    error: str | None = None
    try:
        # Before the engine and the deadline: the first build of a harness's own
        # environment takes minutes, and needs no engine.
        for tool in dict.fromkeys(
            w.spec.harness.tool for w in task.workloads if w.spec.harness is not None
        ):
            harness_python(tool)
        task, raised = _held_positions(task)
        t0 = time.monotonic()
        start = start_engine(adapter, task, python, npu_ids, log_path)
        error = start.error
        if error is None:
            startup_s = time.monotonic() - t0
            effective = _effective_config(start.process, adapter, task, log_path)
            if raised is not None:
                effective = effective.model_copy(update={"notes": (*effective.notes, raised)})
            t1 = time.monotonic()
            _run_variants(start, adapter, task, t0 + deadline_s, done)
            generation_s = time.monotonic() - t1
    except _DeadlinePassed:
        error = _deadline_passed(deadline_s, done.running)
    except (CellError, EngineError, httpx.HTTPError) as exc:
        error = _failure(exc, start.process) if start else f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        # A bug in the farm, or an answer nothing above expected: the cell still ends
        # with its variants and log tail rather than as an opaque Ray task failure.
        error = f"internal error in the runner: {_where(exc)}"
    finally:
        not_released = stop_engine(start.process, task.timeouts.stop_s) if start else None
    error = "; ".join(e for e in (error, *done.problems, not_released) if e) or None
    return CellResult(
        cell_id=task.cell.cell_id,
        status="failed" if error else "ok",
        started_at=started,
        finished_at=datetime.now(UTC),
        node=node,
        argv=start.launch.argv if start else (),
        effective=effective,
        variants=tuple(done.variants),
        startup_s=startup_s,
        generation_s=generation_s,
        npus=len(npu_ids),
        error=error,
        log_tail=_tails(task, log_path) if error else None,
        log_path=str(log_path),
    )


def _held_positions(task: CellTask) -> tuple[CellTask, str | None]:
    """``task`` serving a model folder whose position limit holds the cell's longest
    context (:mod:`farm.runner.positions`), and what was raised; a cell without
    context serves its model as it is."""
    if not task.cell.longest_context:
        return task, None
    path, raised = serving_folder(task.model_path, task.model.max_model_len, farm_home() / "cache")
    if raised is not None:
        print(f"[{task.cell.cell_id}] {raised}", flush=True)
    return task.model_copy(update={"model_path": path}), raised


def _fresh_log(task: CellTask) -> Path:
    """The cell's log file, emptied: the engine process appends to it (a second
    start-up attempt adds to the first), so a cell run again would extend its old log."""
    log_path = Path(task.log_dir) / f"{task.cell.cell_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    return log_path


@dataclass
class _Progress:
    """What the cell's variants gave so far; a cell that fails part-way keeps it.

    ``running`` is the variant being run (the last one once all ran), for the
    deadline's message; ``problems`` are the variants' failures, for the cell's error.
    """

    variants: list[VariantResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    running: Variant | None = None


def _run_variants(
    start: StartedEngine, adapter: EngineAdapter, task: CellTask, deadline: float, done: _Progress
) -> None:
    """Run the cell's variants in order on the started engine, recording into ``done``;
    stop after a variant none of whose requests succeeded. Raises _DeadlinePassed at
    ``deadline`` (``time.monotonic()``)."""
    for variant in task.cell.variants:
        done.running = variant
        workload = next(w for w in task.workloads if w.spec.name == variant.workload)
        run = _within(
            deadline,
            run_variant(start.process, adapter, start.launch, task, variant, workload),
        )
        done.variants.append(_marked(run))
        if run.counters_unusable is not None:
            done.problems.append(
                f"variant {variant.key}: counters unusable: {run.counters_unusable}"
            )
        if run.all_failed is not None:
            # The engine is not serving: further variants would only wait. Its log
            # says why when the answers do not ("see the stack trace above").
            line, known = start.process.failure_reason()
            said = "".join(
                (f"; the engine's log: {line}" if line else "", f" ({known})" if known else "")
            )
            done.problems.append(f"variant {variant.key}: {run.all_failed}{said}")
            if variant != task.cell.variants[-1]:
                done.problems.append("the cell's remaining variants were not run")
            break


def _deadline_passed(deadline_s: float, running: Variant | None) -> str:
    """The cell's error when its deadline passed while ``running`` ran."""
    where = f" during variant {running.key}" if running is not None else ""
    return (
        f"cell deadline of {deadline_s:.0f} s (timeouts.cell_s) passed{where}; "
        "the engine was stopped"
    )


def _within(deadline: float, work: Any) -> VariantRun:
    """Run the coroutine ``work`` to its end, or raise _DeadlinePassed at ``deadline``
    (``work`` is cancelled: its client connections and harness are closed)."""

    async def bounded() -> VariantRun:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            work.close()
            raise _DeadlinePassed
        try:
            result: VariantRun = await asyncio.wait_for(work, timeout=remaining)
        except TimeoutError:
            raise _DeadlinePassed from None
        return result

    return asyncio.run(bounded())


def _marked(run: VariantRun) -> VariantResult:
    """The variant's result, its counters marked unusable with the reason.

    Until ``farm.records`` gives a variant result a ``counters_unusable`` field, the
    reason is in the cell's error and the counters are zero.
    """
    if run.counters_unusable is None or "counters_unusable" not in VariantResult.model_fields:
        return run.result
    return run.result.model_copy(update={"counters_unusable": run.counters_unusable})


def _effective_config(
    engine: EngineProcess, adapter: EngineAdapter, task: CellTask, log_path: Path
) -> EffectiveConfig:
    """What the serving engine really runs (its log, model listing and model config);
    EngineOutputError when the model listing cannot be read."""
    with httpx.Client(base_url=engine.url, timeout=_MODELS_TIMEOUT_S) as client:
        response = client.get("/v1/models")
        response.raise_for_status()
    hf = _hf_config(task.model_path)
    try:
        models = response.json()
        effective = adapter.effective_config(
            task.cell, log_path.read_text(errors="replace"), models, hf
        )
    except (LookupError, TypeError, ValueError, AttributeError) as exc:
        raise EngineOutputError(
            f"GET /v1/models: unreadable model listing ({type(exc).__name__}: {exc}): "
            f"{response.text[:200]!r}"
        ) from None
    # What the prefix-cache rule for hybrids needs to know when the night is judged,
    # where the model's folder may not be.
    return effective.model_copy(update={"hybrid": is_hybrid_config(hf) if hf else None})


def _failure(exc: Exception, engine: EngineProcess) -> str:
    """The cell's error for ``exc``, naming the engine's exit when it died under it."""
    error = f"{type(exc).__name__}: {exc}"
    if not engine.exited():
        return error
    if not isinstance(exc, EngineError):
        error = f"EngineError: engine exited with code {engine.returncode} ({error})"
    line, known = engine.failure_reason()
    if line and line not in error:  # start-up failures name it; a death mid-run does not
        error = f"{error}: {line}"
    return f"{error} ({known})" if known else error


def _where(exc: Exception) -> str:
    """``Type: message at file:line`` of the innermost frame that raised ``exc``."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{at}"


def _hf_config(model_path: str) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config


def _tails(task: CellTask, log_path: Path) -> str:
    """The cell's log tail; a disaggregated cell's is the decode server's (the cell's
    log) and then the prefill server's."""
    if not task.cell.disaggregated:
        return _tail(log_path)
    prefill = _tail(prefill_log_path(log_path))
    return (
        f"{_tail(log_path)}\n--- prefill server ({prefill_log_path(log_path).name}) ---\n{prefill}"
    )


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])
