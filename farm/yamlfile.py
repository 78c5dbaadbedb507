"""The farm's one parse boundary: every file it reads (YAML, JSON, JSON lines) passes here.

Job files, golden case files and patch series are YAML validated by pydantic: the text
is parsed once for data and once for node positions, so every validation error points
at the line it is about. Spool files, build markers, prompt files and the eval
harnesses' outputs are JSON (:func:`parse_json`) or JSON lines (:func:`json_lines`).

What the parsers let through, or fail on with a traceback, is refused here with
:class:`ParseError` (its line, when known): a key given twice (the last would win),
aliases that expand into more values than any real file holds, nesting deeper than
:data:`MAX_DEPTH` (Python's parsers and every walk over the data recurse), an integer
of more than :data:`MAX_INT_DIGITS` digits (Python refuses to convert it), a string
holding a lone surrogate (no UTF-8 encoder takes it: not the store, not a process),
and, in JSON, ``NaN`` and ``Infinity`` (no count or timing is one; the farm's own
JSON never holds them). :func:`read_text` reads the files themselves: a size limit,
UTF-8 only, no NUL bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from farm.errors import FarmError

__all__ = [
    "LOCATED",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_NODES",
    "ParseError",
    "duplicate_keys",
    "json_lines",
    "line_of",
    "load_mapping",
    "parse_json",
    "read_json",
    "read_text",
    "validation_problems",
]

# Values a mapping may expand to, aliases counted each time they are used: far above
# any real job file or series, far below what makes validation take minutes.
MAX_NODES = 100_000
# The context key of a validation error that holds several problems, each at its own
# key: ``((loc, message, first_loc | None), ...)``, locations relative to the error's.
LOCATED = "located"
# Nesting levels a file may have: a job file needs 6, a harness's output about 10.
# Python's recursion limit (1000 frames) is what deeper data runs into.
MAX_DEPTH = 100
# Python's own limit on converting a decimal string to an int (sys.int_info).
MAX_INT_DIGITS = 4300


class ParseError(FarmError):
    """Text that is not usable data: ``reason``, at ``line`` (1-based) when known.
    ``syntax`` marks a JSON syntax error (``reason`` is then the decoder's message,
    ``column`` its column)."""

    def __init__(
        self, reason: str, line: int | None = None, column: int | None = None, syntax: bool = False
    ) -> None:
        super().__init__(f"line {line}: {reason}" if line is not None else reason)
        self.reason = reason
        self.line = line
        self.column = column
        self.syntax = syntax

    def at(self, source: str) -> str:
        """``source:line: reason`` (``source: reason`` when the line is unknown)."""
        where = f"{source}:{self.line}" if self.line is not None else source
        return f"{where}: {self.reason}"


def read_text(path: Path, what: str, error: type[FarmError], max_bytes: int | None = None) -> str:
    """The text of ``path`` (UTF-8, an initial byte-order mark dropped).

    Raises ``error`` naming the file (and the line, for a bad byte) when it cannot be
    read, is larger than ``max_bytes``, is not UTF-8 or holds a NUL byte (a binary
    file); ``what`` says what the file is for (``job file``, ``prompt file``).
    """
    try:
        if max_bytes is not None and (size := path.stat().st_size) > max_bytes:
            raise error(
                f"{path}: {what} is {size:,} bytes, over the limit of {max_bytes:,}; "
                "is it the right file?"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise error(f"{path}:{_line_at(data, nul)}: {what} holds a NUL byte; is it a binary file?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}:{_line_at(data, exc.start)}: {what} is not UTF-8 text "
            f"(byte 0x{data[exc.start]:02x}); save it as UTF-8"
        ) from None


def _line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _text_line(text: str, offset: int) -> int | None:
    return text.count("\n", 0, offset) + 1 if offset >= 0 else None


def _encodable(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _too_deep(at: int | None = None) -> ParseError:
    return ParseError(
        f"nested deeper than {MAX_DEPTH} levels (no file the farm reads nests so deep); "
        "is it the right file?",
        at,
    )


def _check_tree(data: Any) -> str | None:
    """What is wrong with decoded JSON ``data`` (too deep, a lone surrogate), walked
    without recursion."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not _encodable(value):
                return f"the text {_shown(value)} holds a lone surrogate, which is no character"
            continue
        if not isinstance(value, dict | list):
            continue
        if depth > MAX_DEPTH:
            return _too_deep().reason
        if isinstance(value, dict):
            stack.extend((k, depth) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        else:
            stack.extend((v, depth + 1) for v in value)
    return None


def _shown(value: str) -> str:
    return ascii(value[:40] + ("..." if len(value) > 40 else ""))


def parse_json(text: str, *, finite: bool = True) -> Any:
    """The JSON value of ``text``; :class:`ParseError` (with the line) when it is not
    JSON, nests deeper than :data:`MAX_DEPTH`, holds an integer of more than
    :data:`MAX_INT_DIGITS` digits or a lone surrogate, or (``finite``) a number that
    is ``NaN``, ``Infinity`` or too large for a float."""

    def whole(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise ParseError(
                f"an integer of {len(digits.lstrip('-')):,} digits, more than the "
                f"{MAX_INT_DIGITS:,} any number may have",
                _text_line(text, text.find(digits)),
            )
        return int(digits)

    def number(digits: str) -> float:
        value = float(digits)
        if finite and not math.isfinite(value):
            raise ParseError(
                f"{digits[:40]} is too large for a number", _text_line(text, text.find(digits))
            )
        return value

    def constant(name: str) -> float:
        if finite:
            raise ParseError(
                f"{name} is not a number the farm can count or time with",
                _text_line(text, text.find(name)),
            )
        return float(name)

    try:
        data = json.loads(text, parse_int=whole, parse_float=number, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ParseError(exc.msg, exc.lineno, exc.colno, syntax=True) from None
    except RecursionError:
        raise _too_deep() from None
    problem = _check_tree(data)
    if problem is not None:
        raise ParseError(problem)
    return data


def json_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of each line of a JSON-lines file that is not blank.

    Lines end at ``\\n`` only: JSON strings may hold U+2028, U+2029 or U+0085 as
    they are, which :meth:`str.splitlines` would take for line ends."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line


def read_json(
    path: Path,
    what: str,
    error: type[FarmError],
    *,
    max_bytes: int | None = None,
    finite: bool = True,
) -> Any:
    """The JSON value of the file at ``path`` (:func:`read_text`, :func:`parse_json`);
    ``error`` naming the file and line when it cannot be read or parsed."""
    text = read_text(path, what, error, max_bytes)
    try:
        return parse_json(text, finite=finite)
    except ParseError as exc:
        reason = f"not valid JSON: {exc.reason}" if exc.syntax else exc.reason
        raise error(f"{ParseError(reason, exc.line).at(str(path))} ({what})") from None


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what would otherwise be a traceback: nesting
    deeper than :data:`MAX_DEPTH` (its composer recurses), an integer of more than
    :data:`MAX_INT_DIGITS` digits, a lone surrogate (a ``"\\ud800"`` escape)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _too_deep(mark.line + 1 if mark else None)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            _refuse(
                node,
                f"an integer of {digits:,} digits, more than the {MAX_INT_DIGITS:,} "
                "any number may have",
            )
        return super().construct_yaml_int(node)

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        value = super().construct_yaml_str(node)
        if not _encodable(value):
            _refuse(node, f"the text {_shown(value)} holds a lone surrogate, which is no character")
        return value


def _refuse(node: yaml.Node, reason: str) -> NoReturn:
    raise ParseError(reason, node.start_mark.line + 1)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:str", _Loader.construct_yaml_str)


def line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at ``loc`` (or of its closest existing parent)."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if k.value == key), None)
            if found is None:
                # The key itself may be the culprit (an unknown key): point at it.
                found = next((k for k, _ in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            found = node.value[key]
        else:
            found = None
        if found is None:
            break
        node = found
        line = node.start_mark.line + 1
    return line


def duplicate_keys(root: yaml.Node | None, source: str) -> list[str]:
    """``file:line: key: duplicate key 'k' (first at line N)`` for every key given twice
    in one mapping of the tree (YAML loaders keep the last one without a word)."""
    problems: list[str] = []
    seen: set[int] = set()

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if id(node) in seen:  # an alias: its node was checked where it was defined
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key, value in node.value:
                name = str(key.value)
                line = key.start_mark.line + 1
                if name == "<<":  # a merge key may be repeated on purpose
                    continue
                if name in first:
                    problems.append(
                        f"{source}:{line}: {'.'.join((*path, name))}: duplicate key "
                        f"{name!r} (first at line {first[name]})"
                    )
                else:
                    first[name] = line
                walk(value, (*path, name))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, str(i)))

    if root is not None:
        walk(root, ())
    return problems


def _expanded_size(root: yaml.Node) -> tuple[int, int]:
    """How many nodes the tree holds once every alias is expanded, and how deep it
    nests then (each capped just past its limit; memoized per node, no recursion: a
    chain of aliases nests deeper than the text does)."""
    sizes: dict[int, tuple[int, int]] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes and not children_done:
            continue
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if not children_done:
            sizes[id(node)] = (1, 1)  # a cycle (a recursive alias) counts once
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        total = 1 + sum(sizes[id(c)][0] for c in children)
        depth = 1 + max((sizes[id(c)][1] for c in children), default=0)
        sizes[id(node)] = (min(total, MAX_NODES + 1), min(depth, MAX_DEPTH + 1))
    return sizes[id(root)]


def load_mapping(
    text: str, source: str, error: type[FarmError], shape: str
) -> tuple[yaml.Node | None, dict[str, Any]]:
    """The YAML node tree and data of ``text``; ``error`` when it is not a YAML mapping,
    gives a key twice, or expands (through aliases) to more than :data:`MAX_NODES` values."""
    try:
        root = yaml.compose(text, Loader=_Loader)
        size, depth = _expanded_size(root) if root is not None else (0, 0)
        if size > MAX_NODES:
            raise error(
                f"{source}: expands to more than {MAX_NODES:,} values (aliases count each "
                "time they are used); is it the right file?"
            )
        if depth > MAX_DEPTH:
            raise error(f"{_too_deep().at(source)} (aliases count where they are used)")
        duplicates = duplicate_keys(root, source)
        if duplicates:
            raise error(
                "a key is given twice; YAML would keep the last\n  " + "\n  ".join(duplicates)
            )
        data = yaml.load(text, Loader=_Loader)
    except ParseError as exc:
        raise error(exc.at(source)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise error(f"{where}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{source}:1: {shape}")
    return root, data


def validation_problems(
    exc: ValidationError | Sequence[ErrorDetails], root: yaml.Node | None, source: str
) -> list[str]:
    """One ``file:line: key: message`` per error of ``exc``.

    An error carrying :data:`LOCATED` problems gives one line per problem, at its own
    key; a problem with a first location says ``(first at line N)``. A list emptied by
    its own invalid items also reports being too short: the items already say why, so
    that error is left out.
    """
    errors = exc.errors() if isinstance(exc, ValidationError) else list(exc)
    problems = []
    for err in errors:
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if err["type"] == "too_short" and any(
            e is not err and e["loc"][: len(loc)] == err["loc"] for e in errors
        ):
            continue
        located = (err.get("ctx") or {}).get(LOCATED) or (((), err["msg"], None),)
        for rel, message, first in located:
            full = (*loc, *rel)
            key = ".".join(str(p) for p in full) or "<root>"
            if first is not None:
                message += f" (first at line {line_of(root, (*loc, *first))})"
            problems.append(f"{source}:{line_of(root, full)}: {key}: {message}")
    return problems
