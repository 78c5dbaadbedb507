"""`farm bisect` around a FAKE engine: real git, the real store (SQLite and PostgreSQL),
the real search, statistics and CLI; only the sweep of each step is a FAKE (no Ray,
no vLLM): it stores simulated per-request acceptance for the commit it is given
(late positions fall from the guilty commit on) and a failed build for a commit
marked broken. The real engine runs in test_bisect_engine.py.

Covers what the engine test cannot afford: resuming a bisection whose driver died
between steps, a second run that measures nothing, and every bad input (ends swapped
in the history or in the figures, refs that do not exist, an empty range, a bad end
that does not reproduce the drop), each exit 2 with one line and nothing written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pytest
from sqlmodel import Session
from typer.testing import CliRunner

from farm import store
from farm.cli.main import app
from farm.comparable import ComparableKey
from farm.errors import FarmError
from farm.runner import ReferenceRun
from farm.spec import EngineSpec, JobSpec
from farm.store.bisections import get_bisection, list_bisections
from farm.workflows.bisect.setup import prepare_bisect
from farm.workflows.bisect.steps import BisectRun, SweepRunner, run_bisection
from tests.fakes.bisect_sweeps import PROMPTS, FakeSweepRunner
from tests.fakes.plugin_repo import git
from tests.support.bisection import History, plugin_history

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'farm.db'}"
    return str(request.getfixturevalue("pg_url"))


def _run(
    h: History,
    url: str,
    fake: FakeSweepRunner,
    good: int = 0,
    bad: int = -1,
    resume: int | None = None,
) -> tuple[BisectRun, list[str]]:
    lines: list[str] = []
    setup = prepare_bisect(
        h.job, "vllm-cpu", h.commits[good], h.commits[bad], {}, h.folder / "cache"
    )
    run = run_bisection(
        setup,
        db_url=url,
        runner=fake,
        cache_dir=h.folder / "cache",
        say=lines.append,
        resume=resume,
    )
    print("\n".join(lines))
    return run, lines


def test_the_guilty_commit_is_found_around_a_broken_one(tmp_path: Path, url: str) -> None:
    h = plugin_history(tmp_path, 17)
    fake = FakeSweepRunner(url, h.commits, guilty=6, broken=frozenset({8}))
    run, lines = _run(h, url, fake)
    b = run.bisection
    assert b.status == "found", b.reason
    assert b.commits[b.first_bad or 0].sha == h.commits[6]
    assert b.commits[b.last_good or 0].sha == h.commits[5]
    assert b.commits[6].pr == 106
    # The ends ran every planned cell (two: window on and off); steps only the regressed.
    assert [c for c, _ in fake.sweeps[:2]] == [h.commits[0], h.commits[-1]]
    assert all(len(cells) == 2 for _, cells in fake.sweeps)
    steps = len(b.steps)
    skips = sum(s.verdict == "skip" for s in b.steps)
    assert skips == 1 and [s.commit for s in b.steps if s.verdict == "skip"] == [h.commits[8]]
    assert steps <= math.ceil(math.log2(16)) + skips
    assert run.cells == 2 * (2 + steps - skips)  # the broken build's cells never ran
    [skipped] = [s for s in b.steps if s.verdict == "skip"]
    assert "build_failed (FAKE build failed: broken commit)" in skipped.reason
    for s in b.steps:
        if s.verdict != "skip":
            assert s.judgements and all(j.figures.al for j in s.judgements)
            assert len(s.judgements[0].figures.per_position) == 3
    assert any("skip" in line.lower() for line in lines)


def test_steps_pair_their_looks_with_the_good_ends_regressed_variants(
    tmp_path: Path, url: str
) -> None:
    h = plugin_history(tmp_path, 9)
    fake = FakeSweepRunner(url, h.commits, guilty=5)
    run, _ = _run(h, url, fake)
    assert run.bisection.status == "found"
    good_end, bad_end, *steps = fake.paired
    assert good_end == {} and bad_end == {}, "the ends run whole"
    good_sweep = run.bisection.good.sweep_ids[0]
    regressed = set(run.bisection.regressed.values())
    assert steps and all(
        {r.cell_id for r in pairs.values()} == regressed
        and {r.sweep_id for r in pairs.values()} == {good_sweep}
        and all(len(r.prompt_ids) == PROMPTS for r in pairs.values())
        for pairs in steps
    )


def test_a_second_run_measures_nothing_and_resume_continues(tmp_path: Path, url: str) -> None:
    h = plugin_history(tmp_path, 17)
    fake = FakeSweepRunner(url, h.commits, guilty=11)

    class Killed(Exception):
        pass

    def dies_after(n: int) -> SweepRunner:
        def run(job: JobSpec, text: str, references: Mapping[ComparableKey, ReferenceRun]) -> int:
            if len(fake.sweeps) >= n:
                raise Killed  # the driver dies before the step's sweep
            return fake(job, text, references)

        return run

    with pytest.raises(Killed):
        run_bisection(
            prepare_bisect(h.job, "vllm-cpu", h.commits[0], h.commits[-1], {}, h.folder / "cache"),
            db_url=url,
            runner=dies_after(4),  # the ends and two steps
            cache_dir=h.folder / "cache",
            say=print,
        )
    with Session(store.open_store(url)) as s:
        [stored] = list_bisections(s)
    assert stored.status == "running" and len(stored.steps) == 2
    done = {s.commit for s in stored.steps}
    before = len(fake.sweeps)
    resumed, _ = _run(h, url, fake, resume=stored.id)
    assert resumed.bisection.status == "found"
    assert resumed.bisection.commits[resumed.bisection.first_bad or 0].sha == h.commits[11]
    again = [c for c, _ in fake.sweeps[before:]]
    assert not done & set(again), "a finished step was measured again"
    # The resumed steps pair with the good end as stored: it is not measured again.
    assert again and h.commits[0] not in again and all(fake.paired[before:])
    assert h.commits[0] not in again and h.commits[-1] not in again  # ends reused
    assert resumed.reused

    before = len(fake.sweeps)
    second, lines = _run(h, url, fake)
    assert len(fake.sweeps) == before and second.builds == 0 and second.cells == 0
    assert (
        second.bisection.id == stored.id
        and second.bisection.first_bad == resumed.bisection.first_bad
    )
    assert any("stored step(s) reused" in line for line in lines)


def test_bad_ends_in_the_figures_are_refused_and_nothing_is_stored(
    tmp_path: Path, url: str
) -> None:
    h = plugin_history(tmp_path, 9)
    # The drop comes at 3 and goes away at 6: 0 -> 5 is a drop, 4 -> 8 is no drop,
    # 5 -> 7 is a rise (the good end shows the drop).
    fake = FakeSweepRunner(url, h.commits, guilty=3, fixed_from=6)
    with pytest.raises(FarmError, match=r"does not reproduce the drop"):
        _run(h, url, fake, good=0, bad=2)
    with pytest.raises(FarmError, match=r"adjacent commits: nothing between"):
        _run(h, url, fake, good=4, bad=5)  # the README says such a range is refused
    with pytest.raises(FarmError, match=r"--good \w+ shows the drop.*swapped"):
        _run(h, url, fake, good=5, bad=7)
    with Session(store.open_store(url)) as s:
        assert list_bisections(s) == []
    run, _ = _run(h, url, fake, good=0, bad=5)
    assert run.bisection.commits[run.bisection.first_bad or 0].sha == h.commits[3]
    with Session(store.open_store(url)) as s:
        assert get_bisection(s, run.bisection.id or 0).status == "found"


def _cli(h: History, url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        ["bisect", str(h.job_file), "--engine", "vllm-cpu", "--db", url, *args],
        env={"FARM_HOME": str(h.folder / "home"), "COLUMNS": "200"},
    )
    print(result.output)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--good", "{c3}", "--bad", "{c1}"), r"comes after --bad .* are the ends swapped\?"),
        (("--good", "no-such-ref", "--bad", "{c1}"), r"--good no-such-ref: no such commit"),
        (("--good", "{c0}", "--bad", "v9"), r"--bad v9: no such commit"),
        (("--good", "{c2}", "--bad", "{c2}"), r"same commit .* no commits to bisect"),
        (("--good", "{c1}", "--bad", "{c2}"), r"adjacent commits: nothing between them"),
        (("--good", "side", "--bad", "{c3}"), r"not an ancestor"),
        (("--good", "{c0}", "--bad", "{c1}", "--engine", "sglang"), r"--engine sglang: job"),
    ],
)
def test_bad_refs_exit_2_with_one_line_and_write_nothing(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    h = plugin_history(tmp_path, 4)
    git(h.repo.path, "checkout", "-q", "-b", "side", h.commits[0])
    (h.repo.path / "side.txt").write_text("x")
    git(h.repo.path, "add", "-A")
    git(h.repo.path, "commit", "-q", "-m", "side")
    git(h.repo.path, "checkout", "-q", "main")
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    argv = [a.format(**{f"c{i}": c for i, c in enumerate(h.commits)}) for a in args]
    code, output = _cli(h, url, *argv)
    assert code == 2, output
    [line] = [x for x in output.splitlines() if x.startswith("error:")]
    import re

    assert re.search(message, line), line
    assert not (tmp_path / "farm.db").exists()  # nothing written, not even the store


def test_a_finished_bisection_is_shown_reported_and_posted(tmp_path: Path) -> None:
    """Through the CLI, on a store the FAKE engine filled: a rerun of the finished
    bisection measures nothing and posts its answer to a FAKE GitHub; `farm report
    --bisection` shows it as a table, Markdown and HTML."""
    from tests.fakes.github_server import FakeGitHub, FakePull, fake_github

    h = plugin_history(tmp_path, 9)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    fake = FakeSweepRunner(url, h.commits, guilty=6, broken=frozenset({4}))
    run, _ = _run(h, url, fake)
    assert run.bisection.status == "found"
    token = "ghp_FAKEfaketoken0123456789abcdefSECRET"
    state = FakeGitHub(
        token=token, pulls={5: FakePull(head_sha=h.commits[6], base_sha=h.commits[0])}
    )
    with fake_github(state) as github:
        env = {
            "FARM_HOME": str(tmp_path / "home"),
            "COLUMNS": "200",
            "GITHUB_TOKEN": token,
            "FARM_GITHUB_API": github.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        argv = ["bisect", str(h.job_file), "--engine", "vllm-cpu", "--db", url]
        argv += ["--good", h.commits[0], "--bad", h.commits[-1], "--post-github", "acme/plugin#5"]
        result = CliRunner().invoke(app, argv, env=env)
    print(result.output)
    assert result.exit_code == 0, result.output
    assert len(fake.sweeps) == 2 + len(run.bisection.steps)  # nothing measured again
    assert "this run: 0 build(s), 0 cell(s)" in result.output
    assert f"first bad commit: {h.commits[6][:12]}" in result.output
    assert "pull request: #106" in result.output
    assert f"skipped {h.commits[4][:12]}" in result.output
    [comment] = state.comments.values()
    assert f"first bad commit: {h.commits[6][:12]}" in comment["body"]
    assert "| skip |" in comment["body"]

    bid = str(run.bisection.id)
    shown = CliRunner().invoke(app, ["report", "--bisection", bid, "--db", url], env=env)
    assert shown.exit_code == 0 and "first bad commit" in shown.output
    assert h.commits[4][:12] in shown.output and "skip" in shown.output
    page = tmp_path / "b.html"
    argv = ["report", "--bisection", bid, "--db", url, "--format", "html", "--out", str(page)]
    written = CliRunner().invoke(app, argv, env=env)
    assert written.exit_code == 0, written.output
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "pull request #106" in html
    assert html.count("<tr") == 1 + 2 + len(run.bisection.steps)  # head, the ends, the steps
    missing = CliRunner().invoke(app, ["report", "--bisection", "99", "--db", url], env=env)
    assert missing.exit_code == 2 and "--bisection 99: no such bisection" in missing.output


def test_a_broken_commit_just_before_the_guilty_one_is_inconclusive(tmp_path: Path) -> None:
    h = plugin_history(tmp_path, 9)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    fake = FakeSweepRunner(url, h.commits, guilty=5, broken=frozenset({4}))
    run, _ = _run(h, url, fake)
    b = run.bisection
    assert b.status == "inconclusive" and (b.last_good, b.first_bad) == (3, 5)
    assert "one of 2 commits: 1 skipped" in b.reason
    code, output = _cli(h, url, "--good", h.commits[0], "--bad", h.commits[-1])
    assert code == 3, output
    assert f"candidate: {h.commits[4][:12]}" in output
    assert f"candidate: {h.commits[5][:12]}" in output


def test_an_alert_gives_the_engine_the_cell_and_both_ends(tmp_path: Path) -> None:
    """`--from-alert`: a nightly-style alert on a FAKE night at commit 7 against the
    last good night at commit 1 names the engine, the cell and both commits."""
    from farm.results.alerts import AlertCandidate, AlertDetails, AlertFigure, FigureInterval
    from farm.store.alerts import raise_alerts
    from farm.workflows.bisect.ends import alert_ends, alert_refs

    h = plugin_history(tmp_path, 9)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    fake = FakeSweepRunner(url, h.commits, guilty=5)
    setup = prepare_bisect(h.job, "vllm-cpu", h.commits[0], h.commits[-1], {}, tmp_path / "c")
    nights = [fake(_night(setup.engine_at(h.commits[i]), h.job), "night") for i in (1, 7)]
    [cell] = [c for c in setup.cells if c.axes["sliding_window"] == "off"]
    key = cell.key
    value = FigureInterval.of(3.0)
    figure = AlertFigure(
        metric="mean_acceptance_length",
        candidate=cell.cell_id,
        reference=f"{cell.cell_id} in sweep {nights[0]}",
        candidate_value=value,
        reference_value=value,
        difference=value,
    )
    alert = AlertCandidate(
        key="nightly_vs_last_good:mean_acceptance_length:" + key.label,
        kind="nightly_vs_last_good",
        metric="mean_acceptance_length",
        severity="warning",
        summary="AL fell",
        details=AlertDetails(cell=key, sweep_id=nights[1], figures=(figure,)),
    )
    with Session(store.open_store(url)) as s:
        [stored] = raise_alerts(s, nights[1], [alert])
        ends = alert_ends(s, stored.id)
    assert ends.engine == "vllm-cpu"
    assert alert_refs(h.job, ends) == (h.commits[1], h.commits[7])
    assert ends.only["sliding_window"] == "off" and ends.only["model"] == "tiny-mtp"
    assert ends.only["mtp_depth"] == "3"


def _night(engine: EngineSpec, job: JobSpec) -> JobSpec:
    return job.model_copy(update={"engines": (engine,)})


def test_from_alert_bisects_the_nightly_alert_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two FAKE nights (commit 1, then commit 7) judged by the real nightly check raise
    a ``nightly_vs_last_good`` alert; `farm bisect --from-alert ID` takes the engine,
    the cell and both ends from it and names the guilty commit, running only the
    alert's cell (the FAKE engine stands in for each step's sweep)."""
    from farm.store.alerts import list_alerts
    from farm.workflows.nightly.steps import check_night

    h = plugin_history(tmp_path, 9)
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    fake = FakeSweepRunner(url, h.commits, guilty=5)
    setup = prepare_bisect(h.job, "vllm-cpu", h.commits[0], h.commits[-1], {}, tmp_path / "c")
    nights = [fake(_night(setup.engine_at(h.commits[i]), h.job), "night") for i in (1, 7)]
    with Session(store.open_store(url)) as s:
        check_night(s, nights[0], history=1, notifiers=())
        night = check_night(s, nights[1], history=1, notifiers=())
        assert night.verdict.outcome == "regression"
        alerts = [a for a in list_alerts(s) if a.kind == "nightly_vs_last_good"]
    # Both cells (sliding window on and off) fell: one alert each; bisect the first.
    assert len(alerts) == 2
    alert = alerts[0]
    window = dict(alert.details.cell.axes)["sliding_window"]
    monkeypatch.setattr("farm.cli.bisect._runner", lambda url, only, ray: fake)
    before = len(fake.sweeps)
    code, output = _cli_plain(h, url, "--from-alert", str(alert.id))
    assert code == 0, output
    assert f"first bad commit: {h.commits[5][:12]}" in output
    assert f"last good: {h.commits[4][:12]}" in output
    ran = fake.sweeps[before:]
    # The ends are the nights' own builds: their stored cells are reused, not run again.
    assert h.commits[1] not in [c for c, _ in ran] and h.commits[7] not in [c for c, _ in ran]
    [cell] = {cells for _, cells in ran}
    assert len(cell) == 1 and cell[0].endswith(f".swa-{window}")
    with Session(store.open_store(url)) as s:
        [b] = list_bisections(s)
    assert (b.good.commit, b.bad.commit) == (h.commits[1], h.commits[7])
    assert b.good.sweep_ids == (nights[0],) and b.bad.sweep_ids == (nights[1],)
    assert len(b.steps) <= math.ceil(math.log2(6))


def _cli_plain(h: History, url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        ["bisect", str(h.job_file), "--db", url, *args],
        env={"FARM_HOME": str(h.folder / "home"), "COLUMNS": "200"},
    )
    print(result.output)
    return result.exit_code, result.output
