"""The test model (issue 45): each test's chance of being edited when its file is touched,
fitted per repository on the backtest's commits. Unit checks of what it reads, then a history
where only it can find the right tests inside a large file: the tests are grouped in classes
named after the functions they check, but their bodies never name them, so the change's
words cannot tell them apart."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from test_selection.ranking import choice
from test_selection.ranking.test_model import TestText, change_terms, file_features, fit_model
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget
from tests.gitrepo import GitRepo

NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"]  # fmt: skip
CASES = ["small", "large", "empty", "negative", "repeated"]


def test_terms_are_the_defs_the_change_touches_and_the_names_it_removed() -> None:
    terms = change_terms(
        frozenset({"x"}),
        contexts=[" def chunked(iterable, n):", " class Window:"],
        removed=["    return old_helper(iterable, strict=strict)"],
        added=["    return new_helper(iterable)", "def sliding_window(seq):"],
    )
    assert terms.defs == {"chunked", "Window", "sliding_window"}
    assert {"sliding", "window", "chunked"} <= terms.def_words
    assert terms.vanished == {"old_helper", "strict"}


def test_features_read_names_calls_and_removed_names() -> None:
    terms = change_terms(frozenset(), [" def chunked(iterable, n):"], ["x = strict"], [])
    tests = [
        TestText("ChunkedTests::test_even", frozenset({"assert"}), 3),
        TestText("OtherTests::test_calls", frozenset({"chunked", "strict"}), 3),
        TestText("OtherTests::test_plain", frozenset({"assert"}), 3),
    ]
    rows = file_features(tests, terms, [0.0, 0.0, 0.0], [0, 1, 2])
    by_name, calls, gone, own_class = 2, 3, 4, 7
    assert rows[0][by_name] > 0 and rows[1][by_name] == 0 == rows[2][by_name]
    assert rows[1][calls] > 0 and rows[1][gone] > 0 and rows[0][calls] == 0
    assert rows[0][own_class] > 0 and rows[2][own_class] == 0


def test_a_fit_needs_enough_edited_tests_and_gives_probabilities() -> None:
    assert fit_model([[0.0], [1.0]] * 5, [0, 1] * 5, False) is None  # 5 edited: too few
    rows = [[float(i % 10 == 0), float(i % 7)] for i in range(2000)]
    labels = [int(i % 10 == 0 and i % 20 == 0) for i in range(2000)]  # half the flagged ones
    model = fit_model(rows, labels, False)
    assert model is not None and model.positives == 100
    flagged, plain = model.probabilities([[1.0, 3.0], [0.0, 3.0]])
    assert 0.35 < flagged < 0.65 and plain < 0.02  # calibrated: half of those flagged


def _source(version: dict[str, int]) -> str:
    return "".join(
        f"def {name}(x):\n    return x * {version.get(name, 0) + k + 1}\n\n\n"
        for k, name in enumerate(NAMES)
    )


def _tests(edits: dict[tuple[str, str], int]) -> str:
    out = ["from pkg.fns import *  # noqa\n\n\ndef check(value):\n    return value\n\n"]
    for name in NAMES:
        out.append(f"\nclass Test{name.capitalize()}:\n")
        for case in CASES:
            out.append(
                f"    def test_{case}(self):\n"
                f"        assert check({edits.get((name, case), 0)}) >= 0\n\n"
            )
    return "".join(out)


def _history(tmp_path: Path) -> GitRepo:
    """Each commit changes one function and edits two tests of the class named after it."""
    repo = GitRepo(tmp_path / "named")
    version: dict[str, int] = {}
    edits: dict[tuple[str, str], int] = {}
    commits = [
        {
            "pkg/__init__.py": "",
            "pkg/fns.py": _source(version),
            "tests/test_fns.py": _tests(edits),
            "tests/test_other.py": "def test_other():\n    assert True\n",
        }
    ]
    for n in range(1, 56):
        name = NAMES[(n * 7) % len(NAMES)]
        version[name] = n
        for case in (CASES[n % 5], CASES[(n + 2) % 5]):
            edits[(name, case)] = n
        commits.append({"pkg/fns.py": _source(version), "tests/test_fns.py": _tests(edits)})
    stream = []
    for n, files in enumerate(commits):
        stream += [
            "commit refs/heads/main",
            f"committer T <t@example.invalid> {1_700_000_000 + n} +0000",
        ]
        stream.append(f"data {len(f'c{n}')}\nc{n}")
        for path, content in files.items():
            stream += [f"M 100644 inline {path}\ndata {len(content.encode())}", content]
        stream.append("")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo.path,
                   input="\n".join(stream).encode(), check=True)  # fmt: skip
    repo.git("reset", "-q", "--hard", "main")
    return repo


def test_the_backtest_takes_the_model_where_only_the_names_tell_the_tests_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(choice, "REFIT_EVERY", 1)  # replay exactly the newest commits
    repo = _history(tmp_path)
    parent = repo.git("rev-parse", "HEAD^")
    changed = NAMES[(55 * 7) % len(NAMES)]
    config = SelectorConfig(budget=Budget.parse("6%"), cache_dir=tmp_path / "cache")
    plan, _ = select(repo.path, parent, "HEAD", None, config, exclude_paths={"tests/test_fns.py"})
    ranking = plan.ranking
    assert ranking["allocation"] == "model", ranking["reason"]
    by_rule = {(c["ranking"], c["allocation"]): c for c in ranking["candidates"]}
    chosen = by_rule[(ranking["chosen"], "model")]
    spread = by_rule[(ranking["chosen"], "spread")]
    assert chosen["edited_test_recall"] > spread["edited_test_recall"] + 0.3, by_rule
    # the plan's tests are the class named after the changed function, and say why
    picked = [p.test for p in plan.selected]
    assert {t.cls for t in picked} == {f"Test{changed.capitalize()}"}, picked
    assert len(picked) == 5
    reasons = [e.reason for e in plan.selected[0].evidence if e.source == "ranking"]
    assert reasons and "likely edited if its file is" in reasons[0], reasons
    assert "its class's best name match" in reasons[0] or "name shares" in reasons[0], reasons
