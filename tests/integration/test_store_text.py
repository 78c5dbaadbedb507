"""Text PostgreSQL cannot hold. A NUL in an output, an error, a log
tail or an argument is stored in a form both stores take (U+2400, farm.store.text),
the same way in SQLite and PostgreSQL, and a spooled result holding one flushes."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.records import CellResult, RequestRecord
from farm.store import Session, create_sweep, load_sweep, open_store, save_cell_result
from farm.store.spool import flush_spool, spool_result
from farm.store.text import NUL_STORED_AS, stored_text
from tests.support.cell_results import failed_result, ok_result, sample_plan

NUL = "\x00"


def _with_nul(result: CellResult) -> CellResult:
    variants = tuple(
        v.model_copy(
            update={
                "requests": tuple(
                    RequestRecord.model_validate(
                        {**r.model_dump(), "output_text": f"out{NUL}put {i}", "error": f"e{NUL}"}
                    )
                    for i, r in enumerate(v.requests)
                )
            }
        )
        for v in result.variants
    )
    return result.model_copy(
        update={
            "variants": variants,
            "error": f"engine said {NUL}{NUL} and died",
            "log_tail": f"line{NUL}\n",
            "argv": (*result.argv, f"--x={NUL}"),
        }
    )


def _stored(url: str, tmp_path: Path, via_spool: bool) -> list[object]:
    engine = open_store(url)
    try:
        plan = sample_plan()
        with Session(engine) as session:
            sweep_id = create_sweep(session, plan, job_yaml="", host="h")
        ok = _with_nul(ok_result(plan.cells[0]))
        failed = _with_nul(failed_result(plan.cells[1]))
        if via_spool:  # what `farm spool flush` does with a file spooled while it was down
            for r in (ok, failed):
                spool_result(tmp_path / "home", url, sweep_id, r)
            report = flush_spool(engine, tmp_path / "home", url)
            assert len(report.stored) == 2 and not report.kept, report
        else:
            with Session(engine) as session:
                save_cell_result(session, sweep_id, ok)
                save_cell_result(session, sweep_id, failed)
        with Session(engine) as session:
            record = load_sweep(session, sweep_id)
    finally:
        engine.dispose()
    out: list[object] = []
    for cell in record.cells[:2]:
        r = cell.result
        assert r is not None
        out += [r.error, r.log_tail, r.argv[-1]]
        out += [q.output_text for v in r.variants for q in v.requests]
        out += [q.error for v in r.variants for q in v.requests]
    return out


@pytest.mark.parametrize("via_spool", [False, True])
def test_a_nul_is_stored_the_same_way_in_both_stores(
    pg_url: str, tmp_path: Path, via_spool: bool
) -> None:
    sqlite = _stored(f"sqlite:///{tmp_path / 'farm.db'}", tmp_path / "s", via_spool)
    postgres = _stored(pg_url, tmp_path / "p", via_spool)
    assert sqlite == postgres
    # Text columns hold U+2400; JSON columns (argv, the packed request errors) keep
    # the escape \u0000, which both stores take, and read back as NUL from both.
    assert sqlite[2] == f"--x={NUL}" and f"e{NUL}" in sqlite
    texts = [t for t in sqlite if isinstance(t, str) and t not in (f"--x={NUL}", f"e{NUL}")]
    assert texts and [t for t in texts if NUL in t] == []
    assert f"engine said {NUL_STORED_AS}{NUL_STORED_AS} and died" in texts
    assert stored_text(f"out{NUL}put 0") in texts
