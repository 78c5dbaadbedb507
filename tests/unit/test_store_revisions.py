"""The store knows its schema revisions without Alembic (a store at head opens
without importing it); Alembic's own reading of the migrations must agree."""

from __future__ import annotations

import subprocess
import sys

from alembic.config import Config
from alembic.script import ScriptDirectory

from farm.store.schema import MIGRATIONS_DIR, revisions


def test_revision_files_name_alembics_revisions_in_order() -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    script = ScriptDirectory.from_config(cfg)
    oldest_first = [s.revision for s in reversed(list(script.walk_revisions()))]
    assert list(revisions()) == oldest_first
    assert script.get_heads() == [revisions()[-1]]


def test_opening_a_store_at_head_imports_neither_alembic_nor_psycopg(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    run = [sys.executable, "-c"]
    subprocess.run([*run, f"from farm.store.db import open_store; open_store({url!r})"], check=True)
    code = (
        "import sys\n"
        "from farm.store.db import open_store\n"
        f"open_store({url!r}, create=False).dispose()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'psycopg')))\n"
    )
    out = subprocess.run([*run, code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
