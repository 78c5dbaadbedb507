"""MkDocs hook: the pages' generated parts, written from the farm's own code at build time.

A page asks for a part with a marker line; the hook replaces it:

- ``<!-- generated: job-reference -->``: every key of a job file, from the pydantic
  models of :mod:`farm.spec` (fields, types, defaults, constraints, descriptions and
  docstrings), walked from :class:`farm.spec.JobSpec`;
- ``<!-- generated: axes -->``: the matrix axes of :mod:`farm.axes`;
- ``<!-- generated: dialects -->``: the engines' version dialects of
  :mod:`farm.engines.dialects`;
- ``<!-- generated: environment -->``: the environment variables of :mod:`farm.settings`.

So the reference cannot drift from the code: a field added to a model is on the page
at the next build. ``tests/integration/test_docs_build.py`` builds the site.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

TOP = "(top level)"
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: replace each marker line with its generated Markdown."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


# --- the job file ------------------------------------------------------------------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation names, in order (through unions, tuples, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        for model in _models_in(arg):
            if model not in found:
                found.append(model)
    return found


def _is_list(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_list(a) for a in get_args(annotation) if a is not type(None))
    return get_origin(annotation) in (tuple, list)


def type_text(annotation: Any) -> str:
    """A field's type as a job file's author reads it (``list of str``, ``"on" | "off"``)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        limits = [constraints_text(a) for a in args[1:] if isinstance(a, FieldInfo)]
        inner = type_text(args[0])
        return f"{inner} ({', '.join(filter(None, limits))})" if any(limits) else inner
    if origin in (Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return " | ".join(dict.fromkeys(parts))
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (tuple, list):
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        key, value = (type_text(a) for a in args) if args else ("str", "any")
        return f"mapping of {key} to {value}"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def constraints_text(info: FieldInfo) -> str:
    """The field's limits (``> 0``, ``<= 100``, at least 1 entry, pattern)."""
    out: list[str] = []
    for item in info.metadata:
        for attr, sign in _BOUNDS:
            if (bound := getattr(item, attr, None)) is not None:
                out.append(f"{sign} {bound:g}" if isinstance(bound, float) else f"{sign} {bound}")
        if (least := getattr(item, "min_length", None)) is not None:
            out.append(f"at least {least}")
        if (pattern := getattr(item, "pattern", None)) is not None:
            out.append(f"pattern `{pattern}`")
    return ", ".join(out)


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True, validated_data={})
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list):
        return f"`[{', '.join(map(str, value))}]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    return f"`{value}`"


def prose(text: str | None) -> str:
    """A docstring or description as one Markdown paragraph (reST roles as code)."""
    if not text:
        return ""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", " ".join(text.split()))
    return text.replace("``", "`")


def cell(text: str) -> str:
    """Text for a Markdown table cell: a bare ``|`` would end the cell, one inside a code
    span does not (and an escape there would show)."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _paragraphs(doc: str | None) -> str:
    if not doc:
        return ""
    import inspect

    blocks = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(prose(b) for b in blocks)


def _key(name: str, info: FieldInfo) -> str:
    names = [name]
    if isinstance(info.validation_alias, AliasChoices):
        names += [c for c in info.validation_alias.choices if isinstance(c, str) and c != name]
    elif isinstance(info.validation_alias, str) and info.validation_alias != name:
        names.append(info.validation_alias)
    return " or ".join(f"`{n}`" for n in names)


def model_section(model: type[BaseModel], where: str) -> str:
    """One model's heading, docstring and table of keys."""
    rows = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for name, info in model.model_fields.items():
        kind = type_text(info.annotation)
        if limits := constraints_text(info):
            kind += f" ({limits})"
        cells = (_key(name, info), kind, default_text(info), prose(info.description))
        rows.append("| " + " | ".join(cell(c) for c in cells) + " |")
    doc = model.__doc__ if model.__doc__ != BaseModel.__doc__ else ""
    at = "The top level of the file." if where == TOP else f"Written at `{where}`."
    lines = [f"### {model.__name__}", "", at, ""]
    if doc := _paragraphs(doc):
        lines += [doc, ""]
    return "\n".join([*lines, *rows, ""])


def walk(root: type[BaseModel], where: str = TOP) -> list[tuple[type[BaseModel], str]]:
    """Every model reachable from ``root`` with the YAML path it is written at, in order."""
    out: list[tuple[type[BaseModel], str]] = []
    seen: set[type[BaseModel]] = set()

    def visit(model: type[BaseModel], at: str) -> None:
        if model in seen:
            return
        seen.add(model)
        out.append((model, at))
        for name, info in model.model_fields.items():
            prefix = "" if at == TOP else at + "."
            path = prefix + name + ("[]" if _is_list(info.annotation) else "")
            for inner in _models_in(info.annotation):
                visit(inner, path)

    visit(root, where)
    return out


def job_reference() -> str:
    """Markdown for every key of a job file, from :class:`farm.spec.JobSpec` down."""
    from farm.spec import JobSpec

    return "\n".join(model_section(model, where) for model, where in walk(JobSpec))


# --- axes and dialects ---------------------------------------------------------------


def axes_table() -> str:
    from farm.axes import AXES

    rows = [
        "| axis | level | values | default | in cell ids |",
        "| --- | --- | --- | --- | --- |",
    ]
    for ax in AXES:
        if ax.source != "axes":
            values = f"the names of the job's `{ax.source}`"
        elif ax.is_int:
            assert ax.bounds is not None
            values = f"{ax.bounds[0]} to {ax.bounds[1]}"
        else:
            values = ", ".join(f"`{w}`" for w in ax.words)
        default = ", ".join(f"`{v}`" for v in ax.default) or "every entry"
        spelled = f"`{ax.id_prefix}VALUE`" if ax.id_prefix else "`VALUE`"
        rows.append(f"| `{ax.name}` | {ax.level} | {values} | {default} | {spelled} |")
    return "\n".join(rows) + "\n"


def _value_text(value: BaseModel) -> str:
    parts = []
    for name, item in value.model_dump().items():
        if isinstance(item, tuple | list):
            item = " ".join(map(str, item)) or "none"
        parts.append(f"{name}: `{item}`" if item not in ("none", "") else f"{name}: none")
    return "; ".join(parts)


def dialects_text() -> str:
    from farm.engines import dialects

    out: list[str] = []
    for table_name in dialects.__all__:
        table = getattr(dialects, table_name)
        if not isinstance(table, tuple) or not table:
            continue
        value_type = type(table[0].value)
        out += [f"#### `{table_name}`", "", _paragraphs(value_type.__doc__), ""]
        out += ["| releases | value | read in |", "| --- | --- | --- |"]
        for row in table:
            cells = (f"`{row.versions}`", _value_text(row.value), prose(row.source))
            out.append("| " + " | ".join(cell(c) for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def environment_table() -> str:
    from farm.settings import ENV_VARS

    rows = ["| variable | what it sets |", "| --- | --- |"]
    rows += [f"| `{name}` | {cell(prose(doc))} |" for name, doc in ENV_VARS.items()]
    return "\n".join(rows) + "\n"


GENERATORS = {
    "job-reference": job_reference,
    "axes": axes_table,
    "dialects": dialects_text,
    "environment": environment_table,
}
