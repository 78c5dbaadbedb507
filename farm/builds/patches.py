"""Check and apply bundled patch series to an engine tree with GNU ``patch``.

``check_patch`` only ever dry-runs: forward (does it apply?), then reverse (is it
already upstream?). ``apply_patch_series`` applies a whole series in a staging copy of
the files it touches and writes them back only when every patch went in, so a conflict
anywhere leaves the engine tree exactly as it was. GNU patch is used rather than
``git apply`` because it reports every failing hunk (``Hunk #2 FAILED at 153.``), not
just the first, and works on trees that are not git checkouts (an unpacked wheel).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Literal

from filelock import FileLock
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from farm.builds.environment import build_environment, git_environment, run_step
from farm.builds.series import ENGINE_IMPORT_NAMES, Patch, Target, not_applicable_reason
from farm.errors import BuildError
from farm.frozen import Frozen
from farm.masking import mask_text
from farm.settings import get_settings

__all__ = [
    "HunkFailure",
    "PatchError",
    "PatchOutcome",
    "PatchState",
    "PatchStatus",
    "apply_patch_series",
    "check_patch",
    "fetch_release",
    "source_target",
]

# In a check, "applied" means "applies cleanly"; nothing is written.
PatchState = Literal["applied", "already_upstream", "conflict", "not_applicable"]

_FAILED = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_OFFSET = re.compile(r"^Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_FILE = re.compile(r"^(?:checking|patching) file (.+)$")
_MISSING = re.compile(r"^can't find file to patch at input line (\d+)")


class HunkFailure(Frozen):
    """A hunk GNU patch could not place: which file, which hunk, where, and its text."""

    file: str
    hunk: int
    line: int | None = None
    reason: str
    text: str


class PatchStatus(Frozen):
    """What a patch would do to one target; nothing was written to get it."""

    patch_id: str
    target: str
    state: PatchState
    detail: str = ""
    failures: tuple[HunkFailure, ...] = ()

    def describe(self) -> str:
        """One line, then every failing hunk with its text (for errors and logs)."""
        head = f"patch {self.patch_id} on {self.target}: {self.state}"
        lines = [f"{head} ({self.detail})" if self.detail else head]
        for f in self.failures:
            where = f" at line {f.line}" if f.line else ""
            lines.append(f"  {f.file} hunk #{f.hunk}{where}: {f.reason}")
            lines.extend(f"    {t}" for t in f.text.splitlines())
        return "\n".join(lines)


class PatchOutcome(Frozen):
    """What applying one patch of a series did."""

    patch_id: str
    state: PatchState
    detail: str = ""
    files: tuple[str, ...] = ()


class PatchError(BuildError):
    """A patch conflicts with its target, or patching could not run at all.

    ``status`` (when set) carries the failing hunks; the message includes them.
    """

    def __init__(self, message: str, status: PatchStatus | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Run(Frozen):
    returncode: int
    output: str


def _gnu_patch(patch: Patch, cwd: Path, *, reverse: bool, dry_run: bool) -> _Run:
    # --force: never guess "reversed" (with --batch, -R on an unpatched tree is silently
    # ignored and the forward patch applied). --fuzz=0: context must match exactly.
    argv = ["patch", f"-p{patch.strip}", "--force", "--fuzz=0", "--no-backup-if-mismatch"]
    argv += ["--reject-file=-", "-i", patch.diff_path]
    argv += ["--reverse"] if reverse else []
    argv += ["--dry-run"] if dry_run else []
    limits = get_settings().builds
    try:
        proc = run_step(
            argv,
            what=f"apply patch {patch.id}" + (" (dry run)" if dry_run else ""),
            timeout_s=limits.patch_timeout_s,
            kill_wait_s=limits.kill_wait_s,
            setting="FARM_PATCH_TIMEOUT_S",
            env=build_environment({"LC_ALL": "C"}),
            cwd=cwd,
        )
    except FileNotFoundError:
        raise PatchError("GNU patch is not installed (apt-get install patch)") from None
    if proc.returncode > 1:
        raise PatchError(
            f"patch {patch.id}: GNU patch failed (exit {proc.returncode}) in {cwd}:\n"
            + (proc.stdout + proc.stderr).strip()
        )
    return _Run(returncode=proc.returncode, output=proc.stdout + proc.stderr)


def _failures(patch: Patch, output: str) -> tuple[HunkFailure, ...]:
    """The failing hunks named in GNU patch's report, with their text from the diff."""
    by_path = {f.path: f for f in patch.files}
    failures: list[HunkFailure] = []
    current = None
    for line in output.splitlines():
        if m := _FILE.match(line):
            current = by_path.get(m.group(1).strip("'\""))
        elif (m := _FAILED.match(line)) and current is not None:
            n = int(m.group(1))
            text = current.hunks[n - 1].text if n <= len(current.hunks) else ""
            failures.append(
                HunkFailure(
                    file=current.path, hunk=n, line=int(m.group(2)), reason="FAILED", text=text
                )
            )
        elif m := _MISSING.match(line):
            # The report names only the diff's input line: find the section it opens.
            at = int(m.group(1))
            opened = [f for f in patch.files if f.header_line <= at]
            missing = opened[-1] if opened else patch.files[0]
            failures.extend(
                HunkFailure(file=missing.path, hunk=h.number, reason="file not found", text=h.text)
                for h in missing.hunks
            )
    return tuple(failures)


def _offsets(output: str) -> str:
    """``memory_pool_npu.py #1 -3; x.py #1 +4 #2 +4``: hunks GNU patch found moved."""
    moved: dict[str, list[str]] = {}
    current = ""
    for line in output.splitlines():
        if m := _FILE.match(line):
            current = m.group(1).strip("'\"").rsplit("/", 1)[-1]
        elif m := _OFFSET.match(line):
            moved.setdefault(current, []).append(f"#{m.group(1)} {int(m.group(3)):+d}")
    return ("moved: " + "; ".join(f"{n} {' '.join(h)}" for n, h in moved.items())) if moved else ""


def _patch_root(patch: Patch, tree: Path, target: Target | None) -> Path:
    """The folder the patch's paths are relative to (a source tree's package root)."""
    if not tree.is_dir():
        raise PatchError(f"patch {patch.id}: target {tree} is not a folder")
    if patch.root == "source" or target is None or target.tree == "package":
        return tree
    # An overlay's patch: its paths start with the overlay's own import package.
    first = patch.files[0].path.split("/", 1)[0] if patch.overlay else None
    package = first or ENGINE_IMPORT_NAMES.get(patch.engine, patch.engine)
    for candidate in (tree, tree / "python", tree / "src"):
        if (candidate / package).is_dir():
            return candidate
    raise PatchError(
        f"patch {patch.id}: no {package}/ package in {tree} (looked in ., python, src)"
    )


def _check_at(patch: Patch, root: Path, label: str) -> PatchStatus:
    forward = _gnu_patch(patch, root, reverse=False, dry_run=True)
    if forward.returncode == 0:
        return PatchStatus(
            patch_id=patch.id, target=label, state="applied", detail=_offsets(forward.output)
        )
    if _gnu_patch(patch, root, reverse=True, dry_run=True).returncode == 0:
        return PatchStatus(
            patch_id=patch.id, target=label, state="already_upstream", detail="the reverse applies"
        )
    failures = _failures(patch, forward.output)
    return PatchStatus(
        patch_id=patch.id,
        target=label,
        state="conflict",
        detail=f"{len(failures)} hunk(s) fail; the reverse does not apply either",
        failures=failures,
    )


def check_patch(
    patch: Patch,
    target_dir: str | Path,
    target: Target | None = None,
    on_top_of: Sequence[Patch] = (),
) -> PatchStatus:
    """Dry-run ``patch`` against ``target_dir``; never writes.

    ``target`` (release and/or commit, and the tree layout) gates the check on the
    patch's ``applies_to`` (``not_applicable``); without it the content alone decides.
    ``on_top_of``: the patches it requires (its ``requires``), applied first to a copy
    of the files. Returns ``applied`` (applies cleanly),
    ``already_upstream`` (the reverse applies), or ``conflict`` with every failing
    hunk. Raises PatchError when GNU patch is missing, the tree is not where the patch
    expects it, or a patch below it does not apply.
    """
    label = target.label if target else str(target_dir)
    if reason := not_applicable_reason(patch, target):
        return PatchStatus(patch_id=patch.id, target=label, state="not_applicable", detail=reason)
    tree = Path(target_dir)
    if not on_top_of:
        return _check_at(patch, _patch_root(patch, tree, target), label)
    with tempfile.TemporaryDirectory(prefix="farm-patch-") as tmp:
        stage = Path(tmp)
        plan, _ = _stage([*on_top_of, patch], tree, target, stage)
        for below, root in plan[:-1]:
            if root is None:
                continue
            run = _gnu_patch(below, stage / root, reverse=False, dry_run=False)
            if run.returncode != 0:
                raise PatchError(
                    f"patch {patch.id}: {below.id}, which it requires, does not apply to "
                    f"{label}:\n{run.output}"
                )
        root = plan[-1][1]
        assert root is not None  # gated above
        return _check_at(patch, stage / root, label)


def apply_patch_series(
    patches: Sequence[Patch],
    target_dir: str | Path,
    target: Target | None = None,
    *,
    canaries: Collection[str] = (),
) -> list[PatchOutcome]:
    """Apply ``patches`` in order to ``target_dir``, all or nothing.

    Patches already upstream or outside their ``applies_to`` are skipped (and say so).
    A canary or noise patch is refused unless its id is in ``canaries`` (the job must
    name it). On a
    conflict, raises PatchError with the failing hunks; the tree is then untouched,
    including files that earlier patches of the series would have changed.
    """
    tree = Path(target_dir)
    for patch in patches:
        if patch.purpose in ("canary", "noise") and patch.id not in canaries:
            raise PatchError(
                f"patch {patch.id} is a {patch.purpose} patch; it is applied only when a "
                "job names it"
            )
    label = target.label if target else str(tree)
    outcomes: list[PatchOutcome] = []
    with tempfile.TemporaryDirectory(prefix="farm-patch-") as tmp:
        stage = Path(tmp)
        plan, touched = _stage(patches, tree, target, stage)
        for patch, root in plan:
            if root is None:
                gated = check_patch(patch, tree, target)
                outcomes.append(
                    PatchOutcome(patch_id=patch.id, state=gated.state, detail=gated.detail)
                )
                continue
            status = _check_at(patch, stage / root, label)
            if status.state == "conflict":
                raise PatchError(status.describe() + f"\n{tree} was left unchanged", status)
            files: tuple[str, ...] = ()
            if status.state == "applied":
                run = _gnu_patch(patch, stage / root, reverse=False, dry_run=False)
                if run.returncode != 0:
                    raise PatchError(f"patch {patch.id}: applied in a dry run only:\n{run.output}")
                files = tuple((root / f.path).as_posix() for f in patch.files)
            outcomes.append(
                PatchOutcome(
                    patch_id=patch.id, state=status.state, detail=status.detail, files=files
                )
            )
        _write_back(stage, tree, touched)
    return outcomes


def _stage(
    patches: Sequence[Patch], tree: Path, target: Target | None, stage: Path
) -> tuple[list[tuple[Patch, Path | None]], set[Path]]:
    """Copy every file the series touches into ``stage``; each patch's root, or None if gated."""
    plan: list[tuple[Patch, Path | None]] = []
    touched: set[Path] = set()
    for patch in patches:
        if not_applicable_reason(patch, target):
            plan.append((patch, None))
            continue
        root = _patch_root(patch, tree, target).relative_to(tree)
        plan.append((patch, root))
        (stage / root).mkdir(parents=True, exist_ok=True)
        for f in patch.files:
            rel = root / f.path
            touched.add(rel)
            if (tree / rel).is_file() and not (stage / rel).exists():
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tree / rel, stage / rel)
    return plan, touched


def _write_back(stage: Path, tree: Path, touched: set[Path]) -> None:
    for rel in sorted(touched):
        staged, real = stage / rel, tree / rel
        if staged.is_file():
            if real.is_file() and real.read_bytes() == staged.read_bytes():
                continue
            real.parent.mkdir(parents=True, exist_ok=True)
            partial = real.with_name(f".{real.name}.farm-patch")
            shutil.copy2(staged, partial)
            os.replace(partial, real)  # readers see the old or the new file, never half
        elif real.is_file():
            real.unlink()


def source_target(tree: str | Path) -> Target:
    """A source tree as a target, identified by its git ``HEAD`` when it is a checkout root.

    A folder inside some other repository is not identified by that repository's HEAD.
    """
    argv = ["git", "-C", str(tree), "rev-parse", "--show-toplevel", "HEAD"]
    limits = get_settings().builds
    try:
        proc = run_step(
            argv,
            what="identify the source tree",
            timeout_s=limits.git_timeout_s,
            kill_wait_s=limits.kill_wait_s,
            setting="FARM_GIT_TIMEOUT_S",
            env=git_environment(),
        )
    except FileNotFoundError:  # no git on this machine: the tree stays unidentified
        return Target(tree="source")
    out = proc.stdout.split()
    if proc.returncode == 0 and len(out) == 2 and Path(out[0]).resolve() == Path(tree).resolve():
        return Target(commit=out[1], tree="source")
    return Target(tree="source")


def fetch_release(dist: str, version: str, cache_dir: str | Path) -> Path:
    """Download ``dist==version``'s wheel into ``cache_dir`` and return it unpacked.

    The unpacked folder is a package root (``sglang/srt/...``), as in site-packages.
    Uses ``pip download --no-deps --only-binary=:all:``; a cached wheel is not fetched
    again. Raises PatchError with pip's output when the release has no usable wheel.
    """
    try:
        Version(version)
    except InvalidVersion:
        raise PatchError(f"{dist}: {version!r} is not a release version") from None
    wheels = Path(cache_dir)
    wheels.mkdir(parents=True, exist_ok=True)
    with FileLock(str(wheels / f"{canonicalize_name(dist)}-{version}.lock")):
        wheel = _find_wheel(wheels, dist, version)
        if wheel is None:
            argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check"]
            argv += ["--no-deps", "--only-binary=:all:", "-d", str(wheels), f"{dist}=={version}"]
            limits = get_settings().builds
            proc = run_step(
                argv,
                what=f"download {dist}=={version}",
                timeout_s=limits.pip_timeout_s,
                kill_wait_s=limits.kill_wait_s,
                setting="FARM_PIP_TIMEOUT_S",
                env=build_environment(),
            )
            wheel = _find_wheel(wheels, dist, version)
            if proc.returncode != 0 or wheel is None:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
                raise PatchError(
                    mask_text(f"could not download {dist}=={version}: {' '.join(argv)}\n{tail}")
                )
        unpacked = wheels / wheel.name.removesuffix(".whl")
        if not (unpacked / ".farm-unpacked").exists():
            shutil.rmtree(unpacked, ignore_errors=True)
            _unpack(wheel, unpacked)
        return unpacked


def _unpack(wheel: Path, dest: Path) -> None:
    partial = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        partial.chmod(0o755)  # mkdtemp makes it private; the cache is shared
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial)  # extractall drops absolute and ".." parts
        (partial / ".farm-unpacked").write_text(wheel.name + "\n")
        os.replace(partial, dest)
    except (OSError, zipfile.BadZipFile) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise PatchError(f"could not unpack {wheel}: {exc}") from exc


def _find_wheel(folder: Path, dist: str, version: str) -> Path | None:
    for path in sorted(folder.glob("*.whl")):
        try:
            name, found, _build, _tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if name == canonicalize_name(dist) and found == Version(version):
            return path
    return None
