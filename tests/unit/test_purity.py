"""The pure core imports no I/O library (STYLE.md: plan and analysis stay pure)."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("ray", "sqlmodel", "sqlalchemy", "httpx", "subprocess", "farm.store", "farm.runner")


def test_plan_and_analysis_import_no_io() -> None:
    code = (
        "import sys, farm.plan, farm.spec, farm.analysis, farm.records, farm.spec.goldens\n"
        "import farm.analysis.golden_check, farm.analysis.judgement\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pure modules pulled in: {out.stdout.strip()}"


def test_importing_the_cli_starts_nothing() -> None:
    code = "import farm.cli.main, ray; print(ray.is_initialized())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
