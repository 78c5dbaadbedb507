"""What every workflow shares: a session on the store, running a sweep whose results a
verdict will read, checking a sweep to resume against its job, writing a page whole.

Light at import (the CLI's common parts import it): the store, the sweep and Ray load
when a function needs them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from farm.errors import FarmError, OutputError

if TYPE_CHECKING:
    from sqlmodel import Session

    from farm.notify.github import GitHubClient, PullRequestRef
    from farm.orchestrate.driver import SweepEvents, SweepOptions, SweepOutcome
    from farm.plan import Plan, ServerCell
    from farm.records import SweepRecord
    from farm.spec import JobFile, JobSpec

__all__ = [
    "SWEEP_FORM",
    "CellStored",
    "Progress",
    "check_resume",
    "github_client",
    "post_pr_comment",
    "resolve_sweep",
    "resume_problems",
    "run_stored",
    "store_session",
    "write_page",
]

SWEEP_FORM = (
    "sweep {value!r}: expected a sweep id or 'latest' (ids run from 1 to 2**63 - 1; "
    "`farm sweeps` lists them)"
)

# Cell ids a message lists before it says "and N more".
_SHOWN = 5


def write_page(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a reader never sees half a page);
    OutputError when it cannot be written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


# Told by a sweep each time a cell's result is stored: (sweep id, cell id, its end).
CellStored = Callable[[int, str, datetime], None]
# What shows a running sweep (the CLI's console view): the events for one sweep, told
# of each stored result; leaving the context stops the display.
Progress = Callable[[CellStored | None], AbstractContextManager["SweepEvents"]]


@contextmanager
def store_session(url: str) -> Iterator[Session]:
    """A session on the existing store at ``url`` (migrated first); the engine is
    disposed after. Never creates a store: a typo in the URL is an error.

    Raises StoreError when the store does not exist or cannot be reached or migrated,
    StoreDamagedError when it is not a farm store or reading it meets a malformed row
    (the error names the rows).
    """
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    from farm.store.db import open_store, read_error

    engine = open_store(url, create=False)
    try:
        with Session(engine) as session:
            try:
                yield session
            except (ValueError, TypeError, LookupError, SQLAlchemyError) as exc:
                # A row this farm cannot read surfaces as the reader's own error (bad
                # JSON, a timestamp, a validation error); name the rows instead.
                error = read_error(engine, url, exc)
                if error is None:
                    raise
                raise error from None
    finally:
        engine.dispose()


def run_stored(
    job: JobSpec,
    job_text: str,
    options: SweepOptions,
    *,
    then: str,
    progress: Progress,
    stored: CellStored | None = None,
    told: Callable[[SweepOutcome], None] | None = None,
) -> int:
    """Run a sweep whose results a verdict will read (`farm nightly`, `pr`, `bisect`);
    its id. ``progress``: its display; ``stored``: told of each result stored;
    ``told``: the outcome, once the sweep ends. FarmError when some result is not in
    the store, ending with ``then`` (how to go on; ``{sweep}`` in it is the id)."""
    from farm.orchestrate.driver import run_sweep

    with progress(stored) as events:
        outcome = run_sweep(job, job_text, options, events)
    if told is not None:
        told(outcome)
    if outcome.spooled or outcome.unsaved:
        raise FarmError(
            f"sweep {outcome.sweep_id}: {len(outcome.spooled) + len(outcome.unsaved)} "
            "result(s) are not in the store; " + then.replace("{sweep}", str(outcome.sweep_id))
        )
    return outcome.sweep_id


def _identity(cell: ServerCell) -> tuple[str, frozenset[str]]:
    """A planned cell's comparable fingerprint and its variants' (what it measures)."""
    return cell.key.fingerprint, frozenset(
        cell.variant_key(v.axes).fingerprint for v in cell.variants
    )


def _ids(ids: list[str]) -> str:
    more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return ", ".join(ids[:_SHOWN]) + more


def resume_problems(
    stored: SweepRecord, job: JobFile, plan: Plan, only: Mapping[str, str]
) -> list[str]:
    """How this job's ``plan`` differs from the plan sweep ``stored`` was started with:
    another job name, cells it lacks or adds, cells that measure something else."""
    problems = []
    if stored.job != job.spec.name:
        problems.append(
            f"sweep {stored.sweep_id} is of job {stored.job!r}; {job.where('name')} is "
            f"{job.spec.name!r} (another job file?)"
        )
    before = {c.cell.cell_id: c.cell for c in stored.cells}
    now = {c.cell_id: c for c in plan.cells}
    slice_ = " with " + " ".join(f"--only {k}={v}" for k, v in only.items()) if only else ""
    missing = [cid for cid in before if cid not in now]
    if missing:
        problems.append(
            f"this job{slice_} plans {len(now)} of the {len(before)} cells sweep "
            f"{stored.sweep_id} planned; the others ({_ids(missing)}) would never run"
        )
    added = [cid for cid in now if cid not in before]
    if added:
        problems.append(
            f"this job{slice_} plans cells sweep {stored.sweep_id} did not ({_ids(added)})"
        )
    changed = [
        cid for cid in now if cid in before and _identity(now[cid]) != _identity(before[cid])
    ]
    if changed:
        problems.append(
            f"cells measure something else now (workloads, variants or graph mode changed): "
            f"{_ids(changed)}"
        )
    return problems


def check_resume(job: JobFile, plan: Plan, only: Mapping[str, str], db: str, sweep_id: int) -> None:
    """FarmError unless ``plan`` is the plan sweep ``sweep_id`` was started with (same
    job, same cells, same slice); the store must exist. Reads only."""
    from farm.store.cells import load_sweep

    with store_session(db) as session:
        stored = load_sweep(session, sweep_id)
    problems = resume_problems(stored, job, plan, only)
    if problems:
        raise FarmError(
            f"cannot resume sweep {sweep_id}: "
            + "; ".join(problems)
            + "; resume with the job file and --only it was started with, or start a new sweep"
        )


def resolve_sweep(session: Session, sweep: str | int) -> int:
    """The id of sweep ``sweep``: a sweep id, or ``'latest'`` for the newest stored one.

    Raises FarmError for anything else and when the store holds no sweep.
    """
    if sweep == "latest":
        from farm.store.sweeps import latest_sweep_id

        found = latest_sweep_id(session)
        if found is None:
            raise FarmError("the store holds no sweep yet; run `farm run JOB.yaml`")
        return found
    try:
        return int(sweep)
    except ValueError:
        raise FarmError(SWEEP_FORM.format(value=sweep)) from None


def github_client(missing: str) -> GitHubClient:
    """The GitHub client of the configured token (``GITHUB_TOKEN``), API URL and login
    (``farm pr`` tells its own comments by it). FarmError ``missing`` without a token."""
    from farm.notify.github import DEFAULT_API_URL, GitHubClient
    from farm.settings import get_settings

    github = get_settings().github
    if github.token is None:
        raise FarmError(missing)
    return GitHubClient(
        token=github.token.get_secret_value(),
        api_url=github.api_url or DEFAULT_API_URL,
        login=github.login,
    )


def post_pr_comment(ref_text: str, text: str) -> tuple[PullRequestRef, str]:
    """Post ``text`` as a comment on pull request ``ref_text`` (OWNER/REPO#N): the PR
    and the comment's URL. FarmError without a token or when GitHub refuses."""
    from farm.notify.github import parse_pr_ref

    ref = parse_pr_ref(ref_text)
    client = github_client(f"GITHUB_TOKEN is not set: cannot post to {ref}")
    return ref, client.post_issue_comment(ref, text)
