"""Code, patches, jobs and models cite the docs, or say the reason in place.

Users of the package have neither the internal design note kept outside the
repository nor the farm's issue tracker, so a citation of either tells them nothing.
Every text file under the folders below is scanned for the design note (by name or by
its relative path), for the farm's own issue numbers ("issue 15", "issue #11", a
"(#12)" or "(#12 item 3)" tag, "task 3", "finding 7") and for sections of the README
that are no longer there (the README is a front page; the rest lives in docs/). Public upstream
references stay: "vllm-ascend #13523", "vLLM #47602", "sglang PR #27202", "PR #8210".
A pointer into the docs that names a heading (docs/engines.md, "The CPU build: the
embedded default") must name a page and a heading that exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("farm", "patches", "jobs", "models", "bench", "scripts", "deploy", "dashboards")
SCANNED += ("tests",)
THIS_FILE = Path(__file__).resolve()
MAX_BYTES = 2_000_000  # model weights and other large data are not text

OUTSIDE = re.compile(
    r"DESIGN\.md|DESIGN section|\.\./shared"  # the internal design note
    # the tracker
    r"|[Ii]ssue #?[0-9]+|\(#[0-9]{1,2}(?: items? [0-9]+)?\)|\btask [0-9]+|\bfindings? [0-9]+"
)
README_POINTER = re.compile(r"(?:\(|see )README, \"?([A-Z][\w -]*)")
DOCS_POINTER = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md), \"([^\"]+)\"")

# Files allowed to cite the design note, an issue number or a moved README section for
# now: none. test_the_allow_list_only_shrinks keeps an entry from outliving its reason.
ALLOWED_FOR_NOW: frozenset[str] = frozenset()

# Text that matches a pattern and is no citation, per file: removed before matching.
NOT_CITATIONS: dict[str, tuple[str, ...]] = {
    # The docs' own check names what it forbids.
    "tests/integration/test_docs_build.py": ('FORBIDDEN = ("DESIGN.md", "../shared")',),
    # Fake upstream commit subjects of the bisection test.
    "tests/integration/test_bisect_engine.py": ("(#77)", "(#61)"),
}


def _text_files() -> Iterator[tuple[str, str]]:
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path == THIS_FILE:
                continue
            if path.stat().st_size > MAX_BYTES:
                continue
            data = path.read_bytes()
            if b"\0" in data:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            yield path.relative_to(REPO).as_posix(), text


def _readme_headings() -> set[str]:
    lines = (REPO / "README.md").read_text().splitlines()
    return {line.lstrip("#").strip() for line in lines if line.startswith("#")}


def mentions(rel: str, text: str, readme_headings: set[str]) -> list[str]:
    """``file:line: text`` of each citation a user cannot follow in one file."""
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        bare = line
        for allowed in NOT_CITATIONS.get(rel, ()):
            bare = bare.replace(allowed, "")
        cited = OUTSIDE.search(bare) is not None
        for m in README_POINTER.finditer(bare):
            if not any(m.group(1).startswith(h) for h in readme_headings):
                cited = True
        if cited:
            found.append(f"{rel}:{number}: {line.strip()}")
    return found


def _headings(page: Path) -> set[str]:
    lines = page.read_text().splitlines()
    return {line.lstrip("#").strip() for line in lines if line.startswith("#")}


def test_nothing_cites_the_design_note_or_the_issue_tracker() -> None:
    headings = _readme_headings()
    found = [
        hit
        for rel, text in _text_files()
        if rel not in ALLOWED_FOR_NOW
        for hit in mentions(rel, text, headings)
    ]
    assert not found, "cite the docs or say the reason in place:\n" + "\n".join(found)


def test_the_allow_list_only_shrinks() -> None:
    headings = _readme_headings()
    texts = dict(_text_files())
    for rel in sorted(ALLOWED_FOR_NOW):
        assert rel in texts, f"{rel} is gone: delete it from ALLOWED_FOR_NOW"
        assert mentions(rel, texts[rel], headings), (
            f"{rel} cites nothing outside any more: delete it from ALLOWED_FOR_NOW"
        )


def test_pointers_into_the_docs_name_a_page_and_heading_that_exist() -> None:
    bad: list[str] = []
    for rel, text in _text_files():
        # A heading may wrap onto the next line of a comment or docstring.
        flat = re.sub(r"\n\s*(?:#\s*|//\s*)?", " ", text)
        for m in DOCS_POINTER.finditer(flat):
            page, heading = REPO / "docs" / m.group(1), m.group(2)
            if not page.is_file():
                bad.append(f"{rel}: docs/{m.group(1)} does not exist")
            elif heading not in _headings(page):
                bad.append(f'{rel}: docs/{m.group(1)} has no heading "{heading}"')
    assert not bad, "\n".join(bad)


def test_the_scan_sees_what_it_looks_for() -> None:
    headings = {"On a fresh machine", "Documentation"}
    seen = [
        "as ../shared/notes say",
        "(issue 15: 7.8 GB)",
        "issue #11",
        "Issue 20, class 13: the README",
        "fixed (#42)",
        "task 3 of the plan",
        "(issue 14, finding 7)",
        "the sweep lease (finding 3)",
        '(see README, "Dashboards")',
        "(README, Cluster)",
    ]
    for line in seen:
        assert mentions("x.py", line, headings), line
    unseen = [
        "vllm-ascend #13523 and #12521",
        "vLLM #47602",
        "fixed by sglang PR #27202",
        "vllm-ascend PR #8210",
        "the client lists the issue's comments",
        "EngineCore encountered an issue. See stack trace",
        "(README, On a fresh machine)",
        "The names the README, deploy files and users' shells use",
        'files = [README, REPO / "mkdocs.yml"]',
        'docs/detection.md, "Noise-calibrated thresholds"',
    ]
    for line in unseen:
        assert not mentions("x.py", line, headings), line
