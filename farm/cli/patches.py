"""`farm patches check`: every bundled patch against every target it claims (and yours).

Register with ``app.add_typer(patches_app, name="patches")`` in :mod:`farm.cli.main`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from packaging.version import InvalidVersion, Version
from rich.table import Table
from rich.text import Text

from farm.cli.common import console, home, say
from farm.errors import FarmError

if TYPE_CHECKING:
    # farm.builds imports the engines; the command imports them when it runs.
    from farm.builds.patches import PatchStatus
    from farm.builds.series import Patch, PatchSeries, Target

__all__ = ["patches_app"]

patches_app = typer.Typer(rich_markup_mode="markdown", no_args_is_help=True)


@patches_app.callback()
def _group() -> None:
    """Bundled engine patch series (`patches/<engine>/series.yaml`)."""


_STYLE = {
    "applied": ("applies", "green"),
    "already_upstream": ("already upstream", "cyan"),
    "not_applicable": ("not applicable", "dim"),
    "conflict": ("CONFLICT", "red"),
    "unchecked": ("unchecked", "yellow"),
}


@dataclasses.dataclass(frozen=True)
class _Row:
    engine: str
    patch: Patch
    target: Target
    claimed: bool | None  # None: an unidentified tree, nobody claims it
    state: str
    detail: str
    status: PatchStatus | None = None


class _Trees:
    """Where each target's files are: wheels are fetched once per release."""

    def __init__(self, engine: str, source: Path | None) -> None:
        from farm.builds.patches import source_target

        self.engine = engine
        self.source = source
        self.named = source_target(source) if source else None
        self._wheels: dict[str, Path] = {}

    def tree(self, target: Target) -> Path | None:
        if target.version is not None and target.tree == "package":
            if target.version not in self._wheels:
                from farm.builds.patches import fetch_release
                from farm.builds.series import ENGINE_DISTRIBUTIONS

                cache = home() / "cache" / "wheels"
                dist = ENGINE_DISTRIBUTIONS[self.engine]
                self._wheels[target.version] = fetch_release(dist, target.version, cache)
            return self._wheels[target.version]
        named = self.named
        if self.source is not None and named and (target == named or _same_commit(target, named)):
            return self.source
        return None


def _is_release(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _same_commit(a: Target, b: Target) -> bool:
    if a.commit is None or b.commit is None:
        return False
    x, y = a.commit.lower(), b.commit.lower()
    return x.startswith(y) or y.startswith(x)


def _targets(patch: Patch, named: Target | None) -> list[tuple[Target, bool | None]]:
    """The patch's claimed targets, then the named one, each with "does the patch claim it?".

    A named release or commit is claimed when it is inside ``applies_to``; a tree with
    neither (not a git checkout) is checked on content alone and claimed by nobody.
    """
    from farm.builds.series import claimed_targets

    claimed = list(claimed_targets(patch))
    rows: list[tuple[Target, bool | None]] = [(t, True) for t in claimed]
    if named is not None and not any(t == named or _same_commit(t, named) for t in claimed):
        unknown = named.version is None and named.commit is None
        rows.append((named, None if unknown else patch.applies_to.covers(named)))
    return rows


def _rows(series: PatchSeries, named: Target | None, trees: _Trees) -> list[_Row]:
    from farm.builds.patches import check_patch
    from farm.builds.series import not_applicable_reason, required_patches

    rows = []
    for patch in series.patches:
        for target, claimed in _targets(patch, named):
            row = _Row(
                engine=series.engine,
                patch=patch,
                target=target,
                claimed=claimed,
                state="unchecked",
                detail="needs a checkout at this commit: --source PATH",
            )
            # A gated target is reported without downloading or checking anything.
            if reason := not_applicable_reason(patch, target):
                row = dataclasses.replace(row, state="not_applicable", detail=reason)
            elif (tree := trees.tree(target)) is not None:
                status = check_patch(patch, tree, target, required_patches(series, patch))
                row = dataclasses.replace(
                    row, state=status.state, detail=status.detail, status=status
                )
            rows.append(row)
    return rows


def _table(rows: list[_Row]) -> Table:
    table = Table(title="bundled patches", title_justify="left")
    for column in ("engine", "patch", "purpose", "target", "claimed", "status", "detail"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            row.engine,
            row.patch.id,
            row.patch.purpose,
            row.target.label,
            {True: "yes", False: "no", None: "?"}[row.claimed],
            Text(*_STYLE[row.state]),
            row.detail,
        )
    return table


@patches_app.command("check")
def check(
    engine: Annotated[
        str | None, typer.Option(help="sglang | vllm-ascend | vllm; default: every engine")
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="also check this release (its wheel, from PyPI)")
    ] = None,
    source: Annotated[
        Path | None, typer.Option(help="also check this source tree (a checkout)")
    ] = None,
) -> None:
    """Check every bundled patch against each target it claims and the one you name.

    Exits 1 when a patch conflicts with a target it claims, 2 on a malformed series
    or when a release cannot be downloaded.
    """
    from farm.builds.series import (
        ENGINE_DISTRIBUTIONS,
        Target,
        bundled_patches_dir,
        load_series,
    )

    if version and source:
        raise typer.BadParameter("give --version or --source, not both")
    if (version or source) and not engine:
        raise typer.BadParameter("--version and --source need --engine")
    if version is not None and not _is_release(version):
        raise typer.BadParameter(f"--version {version!r} is not a release version (PEP 440)")
    if engine is not None and engine not in ENGINE_DISTRIBUTIONS:
        raise typer.BadParameter(
            f"unknown engine {engine!r}; known: {sorted(ENGINE_DISTRIBUTIONS)}"
        )
    root = bundled_patches_dir()
    engines = [engine] if engine else sorted(p.parent.name for p in root.glob("*/series.yaml"))
    rows: list[_Row] = []
    try:
        for name in engines:
            if not (root / name / "series.yaml").is_file():
                console.print(f"{name}: no bundled patches ({root / name}/series.yaml)")
                continue
            trees = _Trees(name, source.resolve() if source else None)
            named = Target(version=version) if version else trees.named
            rows += _rows(load_series(root / name), named, trees)
    except FarmError as exc:
        say(("error:", "red"), f" {exc}")
        raise typer.Exit(2) from None
    console.print(_table(rows))
    for row in rows:
        if row.state == "conflict" and row.status is not None:
            console.print(row.status.describe(), highlight=False, markup=False)
    bad = [r for r in rows if r.state == "conflict" and r.claimed is True]
    if bad:
        names = ", ".join(f"{r.patch.id} on {r.target.label}" for r in bad)
        say((f"{len(bad)} claimed target(s) conflict:", "red"), f" {names}")
        raise typer.Exit(1)
