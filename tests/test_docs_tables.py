"""The docs' tables stay tables (issue 57): no Markdown table cell in README.md or docs/ is over
300 characters, so a row reads as one line of a reference; the long detail goes in prose after
the table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_CELL = 300
BORDER = re.compile(r"(?<!\\)\|")  # a ``\|`` is a pipe inside a cell, not a border
SEPARATOR = re.compile(r"^:?-+:?$")


def cells(line: str) -> list[str]:
    """A table row's cells, stripped, split on its unescaped pipes."""
    row = line.strip().removeprefix("|")
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [cell.strip() for cell in BORDER.split(row)]


def long_cells(text: str, limit: int = MAX_CELL) -> Iterator[tuple[int, int, str]]:
    """(line, length, the cell's start) of each table cell over ``limit`` characters: rows are
    the lines that start with ``|`` outside fenced code; the separator row is no content."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or not line.lstrip().startswith("|"):
            continue
        row = cells(line)
        if all(SEPARATOR.match(cell) for cell in row):
            continue
        for cell in row:
            if len(cell) > limit:
                yield number, len(cell), cell[:60]


def _rows(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.lstrip().startswith("|"))


def test_no_table_cell_is_over_300_characters() -> None:
    texts = {page: page.read_text(encoding="utf-8") for page in PAGES}
    assert sum(_rows(text) for text in texts.values()) > 50  # the walk found the tables
    found = [
        f"{page.relative_to(ROOT)}:{number}: {length} characters: {start}…"
        for page, text in texts.items()
        for number, length, start in long_cells(text)
    ]
    assert not found, "table cells over 300 characters (move the detail after the table):\n" + (
        "\n".join(found)
    )


def test_a_long_cell_is_caught_and_an_escaped_pipe_does_not_split_one() -> None:
    table = "\n".join(
        [
            "| command | what it does |",
            "|---|---|",
            f"| `short` | {'x' * MAX_CELL} |",  # at the limit: allowed
            f"| `long` | {'x' * (MAX_CELL + 1)} |",
            # 50 short pieces joined by escaped pipes: one cell of 396 characters
            "| `--budget 15%\\|all` | " + " \\| ".join(["word"] * 50) + " |",
            "|" + "-" * 400 + "|",  # a separator row, however long
            "```",
            f"| {'y' * 400} |",  # fenced code is not a table
            "```",
        ]
    )
    assert [(number, length) for number, length, _ in long_cells(table)] == [(4, 301), (5, 396)]
    assert cells("| `--agent local\\|llm` | b |") == ["`--agent local\\|llm`", "b"]
    assert cells("| a | ends in a pipe \\|") == ["a", "ends in a pipe \\|"]
