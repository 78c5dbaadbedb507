"""`farm submit`: run a sweep as a Ray Job on a cluster, so it outlives the submitter.

The job's entrypoint is `farm run JOB --ray-address auto ...` on the cluster's head,
with the checkout uploaded as the job's working directory (``farm.orchestrate.jobs``
talks to the job server).

A job's description (entrypoint, ``runtime_env``, metadata) is returned by the job
server to anyone who may list jobs, so it carries no secret: the job finds its store
on the cluster side, in the head's own ``FARM_DB_URL`` (docs/cluster.md; the deploy
files set it from a secret). ``--db`` only names a store whose URL holds no password
(the cluster then authenticates with its own ``~/.pgpass`` or ``PGPASSWORD``).
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from farm.cli.common import console, fail
from farm.cli.inputs import STORE_ID
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.orchestrate.jobs import SubmitError

__all__ = ["Submission", "SubmitError", "make_submission", "submit", "submit_app"]

submit_app = typer.Typer(rich_markup_mode="markdown")


def __getattr__(name: str) -> Any:
    # SubmitError is part of this module's API, but farm.orchestrate.jobs imports Ray: it is
    # imported when asked for, not when `farm --help` loads the command.
    if name == "SubmitError":
        from farm.orchestrate.jobs import SubmitError

        return SubmitError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Never uploaded: the local venv and caches are large and machine-specific.
_EXCLUDES = (".venv", ".git", "**/__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache")


@dataclasses.dataclass(frozen=True)
class Submission:
    """What `farm submit` sends: the entrypoint and its runtime environment."""

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

    Nothing in it is secret: without ``db_url`` the job uses the cluster's own
    ``FARM_DB_URL``. A ``db_url`` travels as ``FARM_DB_URL`` in the job's environment
    and must therefore hold no password: SubmitError otherwise.
    """
    from farm.orchestrate.jobs import SubmitError

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
    env = {"FARM_DB_URL": _public_store_url(db_url)} if db_url else {}
    runtime_env: dict[str, Any] = {"working_dir": str(root), "excludes": list(_EXCLUDES)}
    if env:
        runtime_env["env_vars"] = env
    return Submission(
        entrypoint=shlex.join(argv),
        runtime_env=runtime_env,
        metadata={"farm_job": relative.as_posix()},
    )


def _check_locally(job_file: Path, only: list[str] | None) -> None:
    """The job file is a job and ``--only`` slices it (as `farm plan` checks them;
    node-side paths are the cluster's business). FarmError otherwise."""
    from farm.cli.common import parse_pairs
    from farm.cli.preflight import check_job

    if not job_file.is_file():
        raise FarmError(f"{job_file}: no such job file")
    check_job(job_file, parse_pairs(only, "--only", "AXIS=VALUE"), on_this_machine=False)


def _public_store_url(url: str) -> str:
    """``url`` if it may be shown to every reader of the job API; SubmitError if it
    holds a password (or a secret-looking query parameter)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from farm.masking import looks_secret, mask_text
    from farm.orchestrate.jobs import SubmitError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise SubmitError(f"--db {mask_text(url)!r} is not a store URL") from None
    if parsed.password is not None or any(looks_secret(k) for k in parsed.query):
        raise SubmitError(
            f"--db {parsed.set(query={}).render_as_string(hide_password=True)}: holds a "
            "password, and the "
            "job server shows a job's environment to anyone who may list jobs; leave --db out "
            "so the job uses the cluster's own FARM_DB_URL (see the docs: Operating a "
            "cluster), or give a URL without the password and keep it in the cluster's "
            "~/.pgpass"
        )
    return url


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
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="store URL without a password; default: the cluster's own FARM_DB_URL",
        ),
    ] = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="AXIS=VALUE")] = None,
    resume: Annotated[int | None, typer.Option(help="finish sweep N", parser=STORE_ID)] = None,
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
    from farm.masking import mask_secrets
    from farm.orchestrate.jobs import JobServer, SubmitError
    from farm.settings import get_settings

    if address is not None and not address.strip():
        raise typer.BadParameter("is empty: give the head's dashboard URL", param_hint="--address")
    address = address or get_settings().ray.api_server_address
    given = [name for name, v in (("--status", status), ("--logs", logs), ("--stop", stop)) if v]
    if len(given) > 1:
        raise typer.BadParameter(f"{' and '.join(given)}: give one of them")
    if given and job_file is not None:
        raise typer.BadParameter(f"{given[0]} takes no JOB file; give one or the other")
    try:
        if status or logs or stop:
            server = JobServer(address)
            job_id = status or logs or stop
            if stop:
                server.stop(stop)
            if logs:
                console.print(server.logs(logs), markup=False, highlight=False, end="")
            else:
                console.print(Text(f"{job_id}: {server.status(str(job_id))}"))
            return
        if job_file is None:
            raise typer.BadParameter("give a JOB file, or --status/--logs/--stop ID")
        # Checked before the cluster is contacted: a missing job file, a bad --only or
        # a refused --db needs no network and is not "cannot reach the server".
        _check_locally(job_file, only)
        spec = make_submission(job_file, working_dir, only, db, resume, dry_run)
        server = JobServer(address)
        job_id = server.submit(spec.entrypoint, spec.runtime_env, spec.metadata)
    except FarmError as exc:
        raise fail(exc) from None
    # Text, not markup: the entrypoint holds the user's paths and --only values.
    console.print(Text.assemble("submitted ", (job_id, "bold"), f": {spec.entrypoint}"))
    shown = mask_secrets(address)
    console.print(Text(f"`farm submit --status {job_id}` / `--logs {job_id}` (address {shown})"))
    if not wait:
        return
    try:
        state = server.wait(job_id)
        console.print(Text(f"{job_id}: {state}"))
        if state != "SUCCEEDED":
            console.print(server.logs(job_id)[-4000:], markup=False, highlight=False)
            raise typer.Exit(1)
    except SubmitError as exc:
        raise fail(exc) from None
