"""`farm submit`: run a sweep as a Ray Job on a cluster, so it outlives the submitter.

The job's entrypoint is `farm run JOB --ray-address auto ...` on the cluster's head,
with the checkout uploaded as the job's working directory (``farm.orchestrate.jobs``
talks to the job server).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict

from farm.cli.common import console, fail
from farm.orchestrate.jobs import JobServer, SubmitError
from farm.settings import get_settings

__all__ = ["Submission", "SubmitError", "make_submission", "submit", "submit_app"]

submit_app = typer.Typer()

# Never uploaded: the local venv and caches are large and machine-specific.
_EXCLUDES = (".venv", ".git", "**/__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache")


class Submission(BaseModel):
    """What `farm submit` sends: the entrypoint and its runtime environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]


def make_submission(
    job_file: Path,
    working_dir: Path,
    only: list[str] | None = None,
    db_url: str | None = None,
    resume: int | None = None,
    dry_run: bool = False,
) -> Submission:
    """The Ray Job for ``farm run job_file``; the job file must lie in ``working_dir``.

    The store URL, when given, travels as ``FARM_DB_URL`` in the job's environment
    rather than on the command line that job listings show.
    """
    root = working_dir.resolve()
    try:
        relative = job_file.resolve().relative_to(root)
    except ValueError:
        raise SubmitError(
            f"{job_file} is outside the working directory {root}, which is what the "
            "cluster receives; pass --working-dir"
        ) from None
    argv = ["farm", "run", relative.as_posix(), "--ray-address", "auto"]
    for item in only or []:
        argv += ["--only", item]
    if resume is not None:
        argv += ["--resume", str(resume)]
    if dry_run:
        argv.append("--dry-run")
    env = {"FARM_DB_URL": db_url} if db_url else {}
    runtime_env: dict[str, Any] = {"working_dir": str(root), "excludes": list(_EXCLUDES)}
    if env:
        runtime_env["env_vars"] = env
    return Submission(
        entrypoint=shlex.join(argv),
        runtime_env=runtime_env,
        metadata={"farm_job": relative.as_posix()},
    )


@submit_app.command()
def submit(
    job_file: Annotated[Path | None, typer.Argument(help="job spec (YAML) to run")] = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="the head's dashboard URL; default: RAY_API_SERVER_ADDRESS, "
            "else http://127.0.0.1:8265"
        ),
    ] = None,
    working_dir: Annotated[Path, typer.Option(help="uploaded as the job's folder")] = Path("."),
    db: Annotated[str | None, typer.Option("--db", help="store URL for the sweep")] = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="AXIS=VALUE")] = None,
    resume: Annotated[int | None, typer.Option(help="finish sweep N")] = None,
    dry_run: Annotated[bool, typer.Option(help="the job only plans")] = False,
    wait: Annotated[
        bool, typer.Option(help="wait for the job to end; exit 1 unless it succeeded")
    ] = False,
    status: Annotated[
        str | None, typer.Option("--status", metavar="ID", help="show a job's status")
    ] = None,
    logs: Annotated[
        str | None, typer.Option("--logs", metavar="ID", help="print a job's logs")
    ] = None,
    stop: Annotated[str | None, typer.Option("--stop", metavar="ID", help="stop a job")] = None,
) -> None:
    """Submit `farm run JOB` to a Ray cluster as a Ray Job, or show or stop a submitted one."""
    address = address or get_settings().ray.api_server_address
    try:
        server = JobServer(address)
        if status or logs or stop:
            job_id = status or logs or stop
            if stop:
                server.stop(stop)
            if logs:
                console.print(server.logs(logs), markup=False, highlight=False, end="")
            else:
                console.print(f"{job_id}: {server.status(str(job_id))}", highlight=False)
            return
        if job_file is None:
            raise typer.BadParameter("give a JOB file, or --status/--logs/--stop ID")
        spec = make_submission(job_file, working_dir, only, db, resume, dry_run)
        job_id = server.submit(spec.entrypoint, spec.runtime_env, spec.metadata)
    except SubmitError as exc:
        raise fail(exc) from None
    console.print(f"submitted [bold]{job_id}[/bold]: {spec.entrypoint}", highlight=False)
    console.print(f"`farm submit --status {job_id}` / `--logs {job_id}` (address {address})")
    if not wait:
        return
    state = server.wait(job_id)
    console.print(f"{job_id}: {state}", highlight=False)
    if state != "SUCCEEDED":
        console.print(server.logs(job_id)[-4000:], markup=False, highlight=False)
        raise typer.Exit(1)
