"""The local paths a run of a job reads, checked on the file system."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from farm.spec.job import JobFile, JobSpec
from farm.spec.sources import BuildSource, WheelSource


def _pinned(job: JobSpec) -> bool:
    """True when the job's cells run only on labelled nodes (a label selector or engine
    pools): absolute model and dataset paths are then the nodes' mounts."""
    return bool(job.resources.label_selector) or any(e.pools for e in job.engines)


def check_job_paths(job: JobFile, on_this_machine: bool) -> tuple[list[str], list[str]]:
    """Problems and notes about the local paths a run of ``job`` reads, as
    ``file:line: key: problem``. Reads only the file system.

    Missing wheels, trees, local git repositories, task folders and golden case files
    are problems.
    A missing model directory or dataset file is a problem too, except an absolute one
    in a job pinned to labelled nodes that is not run on this machine
    (``on_this_machine``): that path is the nodes' mount, and is only noted.
    """
    check = _PathCheck(job, node_side=_pinned(job.spec) and not on_this_machine)
    spec = job.spec
    for i, model in enumerate(spec.models):
        mount = Path(model.path).is_absolute()
        check.need(spec.resolve(model.path), "any", ("models", i, "path"), mount)
    # Each engine's source, then the sources of its overlays.
    sources: list[tuple[tuple[int | str, ...], str, BuildSource]] = [
        (("engines", i), e.package, e.source) for i, e in enumerate(spec.engines)
    ]
    sources += [
        (("engines", i, "overlays", n), o.package, o.source)
        for i, e in enumerate(spec.engines)
        for n, o in enumerate(e.overlays)
    ]
    for at, package, src in sources:
        check.source(at, package, src)
    for i, ref in enumerate(spec.goldens):
        check.need(Path(ref.path), "any", ("goldens", i, "path"))
    for i, workload in enumerate(spec.workloads):
        if workload.context.document is not None:
            check.need(
                spec.resolve(workload.context.document), "file", ("workloads", i, "context")
            )
        harness = workload.harness
        if harness is None:
            continue
        if harness.include_path is not None:
            loc = ("workloads", i, "harness", "include_path")
            check.need(Path(harness.include_path), "dir", loc)
        if harness.dataset_path is not None and Path(harness.dataset_path).is_absolute():
            loc = ("workloads", i, "harness", "dataset_path")
            check.need(Path(harness.dataset_path), "any", loc, mount=True)
    return check.problems, check.notes


class _PathCheck:
    """The problems and notes found so far about one job file's paths."""

    def __init__(self, job: JobFile, *, node_side: bool) -> None:
        self.job = job
        self.node_side = node_side
        self.problems: list[str] = []
        self.notes: list[str] = []

    def need(
        self,
        path: Path,
        kind: Literal["dir", "file", "any"],
        loc: tuple[int | str, ...],
        mount: bool = False,
    ) -> None:
        """``path`` must be a folder, a file or either; ``mount``: it may be a mount of
        the nodes (written absolute, read by cells), only noted when not here."""
        if kind == "any" and path.exists():
            return
        if (kind == "dir" and path.is_dir()) or (kind == "file" and path.is_file()):
            return
        where = self.job.where(*loc)
        if path.exists():
            self.problems.append(
                f"{where}: {path} is not a {'folder' if kind == 'dir' else 'file'}"
            )
        elif self.node_side and mount:
            self.notes.append(
                f"{where}: {path} is not on this machine; the nodes that run "
                "the job's cells must have it"
            )
        else:
            self.problems.append(f"{where}: {path} does not exist")

    def source(self, at: tuple[int | str, ...], package: str, src: BuildSource) -> None:
        """The local paths of one engine's or overlay's source."""
        # Imported here: packaging.utils pulls in subprocess (platform tags).
        from packaging.utils import canonicalize_name

        if isinstance(src, WheelSource):
            self.need(Path(src.path), "file", (*at, "source", "path"))
            held = src.distribution()
            if held != canonicalize_name(package):
                where = self.job.where(*at, "source", "path")
                self.problems.append(f"{where}: the wheel holds {held}, not package {package}")
        elif src.kind == "tree":
            self.need(Path(src.path), "dir", (*at, "source", "path"))
        elif src.kind in ("git", "pr"):
            mirror = src.mirror
            if (
                (mirror is None or not Path(mirror).exists())
                and src.repo
                and not src.is_remote(src.repo)
            ):
                self.need(Path(src.repo), "dir", (*at, "source", "repo"))
            elif mirror is not None and src.repo is None:
                self.need(Path(mirror), "dir", (*at, "source", "mirror"))
