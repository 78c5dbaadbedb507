"""Text both stores take, stored the same way in both.

PostgreSQL's text type cannot hold the NUL character (``invalid byte sequence for
encoding "UTF8": 0x00``); SQLite can. An engine's output or log holding a NUL would
then be stored in one store and refused forever by the other (a spool file that
never flushes). So every string bound to a statement, in either store, has each NUL
replaced by U+2400 SYMBOL FOR NULL (``␀``): visible where the text is shown, one
character for one, and what a reader of either store gets back. JSON columns
(``argv``, the packed request errors) are unaffected: their NUL is the JSON escape
``\\u0000``, which both stores take (the columns are ``json``, not ``jsonb``) and
give back as a NUL.

:func:`install` hooks it into an engine (``farm.store.connection.connect`` calls it), so no
write path can forget it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

__all__ = ["NUL_STORED_AS", "install", "stored_text"]

NUL_STORED_AS = "\u2400"


def stored_text(value: str) -> str:
    """``value`` as the store keeps it: each NUL replaced by U+2400."""
    return value.replace("\x00", NUL_STORED_AS) if "\x00" in value else value


def _scrub(params: Any) -> Any:
    if isinstance(params, str):
        return stored_text(params)
    if isinstance(params, dict):
        return {k: _scrub(v) for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return type(params)(_scrub(v) for v in params)
    return params


def _before_execute(
    _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool
) -> tuple[str, Any]:
    return statement, _scrub(parameters)


def install(engine: sa.Engine) -> None:
    """Make every statement of ``engine`` bind strings as :func:`stored_text`."""
    sa.event.listen(engine, "before_cursor_execute", _before_execute, retval=True)
