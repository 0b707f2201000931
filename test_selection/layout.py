"""Where a repository keeps its tests: its pytest configuration, else the common layouts.

PyTorch keeps them in ``test/``, torch-spyre and most Python projects in ``tests/``, others
beside the code (``pkg/sub/tests/test_x.py``, ``pkg/x_test.py``). A repository that
configures pytest (``testpaths``,
``python_files`` in ``pytest.ini``, ``pyproject.toml``, ``tox.ini`` or ``setup.cfg``) says
where its tests are; that is honoured first. Read from git objects at a revision, never
from a checkout, and never executed.
"""

from __future__ import annotations

import configparser
import fnmatch
import shlex
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from test_selection.git import GitError, Repo

# where pytest itself looks when nothing is configured: test_*.py and *_test.py at any depth
# (in fnmatch, * crosses folders), apart from the folders it never enters (NO_RECURSE)
DEFAULT_PATTERNS = ("test_*.py", "*/test_*.py", "*_test.py")
PYTEST_PYTHON_FILES = ("test_*.py", "*_test.py")  # pytest's own default for python_files
NO_RECURSE = ("*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}")
_CONFIG_FILES = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


@dataclass(frozen=True)
class Layout:
    """The glob patterns of test files, and where they came from (for messages)."""

    patterns: tuple[str, ...]
    source: str  # "pytest.ini [pytest]", "defaults", "--pattern", ...


def _words(value: object) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return shlex.split(value.replace("\n", " "))
    return []


def _pytest_section(name: str, text: str) -> dict[str, object] | None:
    """The pytest options a configuration file holds, or None when it configures no pytest."""
    if name == "pyproject.toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return None
        options = data.get("tool", {}).get("pytest", {}).get("ini_options")
        return options if isinstance(options, dict) else None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    section = {"pytest.ini": "pytest", "tox.ini": "pytest", "setup.cfg": "tool:pytest"}[name]
    if (
        name == "pytest.ini"
        and not parser.has_section(section)
        and parser.has_section("tool:pytest")
    ):
        section = "tool:pytest"
    return dict(parser.items(section)) if parser.has_section(section) else None


def patterns_from_pytest(options: dict[str, object]) -> tuple[str, ...] | None:
    """Globs for ``testpaths`` × ``python_files``; None when neither is configured."""
    paths = [p.strip("/") for p in _words(options.get("testpaths")) if p.strip("/.")]
    files = _words(options.get("python_files")) or list(PYTEST_PYTHON_FILES)
    if not paths and not options.get("python_files"):
        return None
    if not paths:
        return tuple(f"*{f}" if not f.startswith("*") else f for f in files)
    out: list[str] = []
    for path in paths:
        for pattern in files:
            out += [f"{path}/{pattern}", f"{path}/**/{pattern}"]
    return tuple(dict.fromkeys(out))


def _outside_packages(repo: Repo, rev: str, options: dict[str, object]) -> tuple[str, ...]:
    """Globs for test files outside ``testpaths`` that are still the repository's tests:
    ``python_files`` in top-level folders that are not Python packages (``benchmarks/``,
    ``examples/``). ``testpaths`` only says where a bare ``pytest`` starts; those are run by
    naming them, and a change can break them too. Inside a package (``torch/``) a
    ``test_*.py`` is more likely a helper (``test_case.py``) and stays a source file."""
    if not _words(options.get("testpaths")):
        return ()
    try:
        listing = repo.text("ls-tree", "--end-of-options", rev)
    except GitError:
        return ()
    folders = []
    configured = {p.strip("/").split("/", 1)[0] for p in _words(options.get("testpaths"))}
    for line in listing.splitlines():
        meta, _, name = line.partition("\t")
        if meta.split()[1:2] != ["tree"] or name in configured:
            continue
        if any(fnmatch.fnmatchcase(name, n) for n in NO_RECURSE):
            continue
        folders.append(name)
    if not folders:
        return ()
    packages = set()
    try:
        found = repo.text(
            "ls-tree",
            "--name-only",
            "--end-of-options",
            rev,
            "--",
            *(f"{f}/__init__.py" for f in folders),
        )
        packages = {line.split("/", 1)[0] for line in found.splitlines()}
    except GitError:
        pass
    files = _words(options.get("python_files")) or list(PYTEST_PYTHON_FILES)
    return tuple(
        pattern
        for folder in folders
        if folder not in packages
        for f in files
        for pattern in (f"{folder}/{f}", f"{folder}/*/{f}")
    )


def pytest_settings(repo: Repo, rev: str) -> list[tuple[str, dict[str, object] | None]]:
    """Each configuration file's pytest options at ``rev`` (what a change to pytest's
    configuration is measured by: other edits to those files change no test's run)."""
    out: list[tuple[str, dict[str, object] | None]] = []
    for name in _CONFIG_FILES:
        data = repo.show(rev, name)
        text = data.decode("utf-8", errors="replace") if data is not None else None
        out.append((name, _pytest_section(name, text) if text is not None else None))
    return out


def pytest_options(read: Callable[[str], str | None]) -> dict[str, object]:
    """The pytest options of the first configuration file that configures pytest, as pytest
    picks it (``read``: a file's text by name, None when absent); none: ``{}``."""
    for name in _CONFIG_FILES:
        text = read(name)
        options = _pytest_section(name, text) if text is not None else None
        if options is not None:
            return options
    return {}


def conftest_scopes(paths: Iterable[str]) -> list[tuple[str, str]]:
    """Each ``conftest.py`` among ``paths`` with the folder it applies to ('' for the root):
    pytest loads it for every test below that folder."""
    return [(p, p.rpartition("/")[0]) for p in paths if p.rsplit("/", 1)[-1] == "conftest.py"]


def below(folder: str, path: str) -> bool:
    """Whether ``path`` is inside ``folder`` ('' is the root, which holds everything)."""
    return not folder or path.startswith(folder + "/")


def configured(settings: list[tuple[str, dict[str, object] | None]]) -> dict[str, object]:
    """From ``pytest_settings``: the options of the first file that configures pytest, as
    pytest picks it (``{}``: none does)."""
    return next((options for _name, options in settings if options is not None), {})


def settings_change(
    before: list[tuple[str, dict[str, object] | None]],
    after: list[tuple[str, dict[str, object] | None]],
) -> str | None:
    """The first configuration file whose pytest options differ between two readings of
    ``pytest_settings`` (None: pytest runs as it did)."""
    return next(
        (name for (name, old), (_same, new) in zip(before, after, strict=True) if old != new),
        None,
    )


def not_recursed(options: dict[str, object]) -> tuple[str, ...]:
    """The folders pytest never enters on its own: ``norecursedirs``, else its default."""
    return tuple(_words(options.get("norecursedirs"))) or NO_RECURSE


def recursed(path: str, skipped: tuple[str, ...]) -> bool:
    """Whether pytest, walking the tree, reaches ``path`` (no folder on the way matches
    ``skipped``). Naming a file on the command line bypasses ``norecursedirs``: a caller that
    names files filters them with this first."""
    folders = path.split("/")[:-1]
    return not any(
        fnmatch.fnmatchcase("/".join(folders[: k + 1]) if "/" in pattern else folder, pattern)
        for k, folder in enumerate(folders)
        for pattern in skipped
    )


# options of ``addopts`` that choose which tests run (kept where addopts is otherwise dropped)
_SELECTING = ("-m", "-k", "--ignore", "--ignore-glob", "--deselect")


def selecting_addopts(options: dict[str, object]) -> list[str]:
    """From ``addopts``, the options that choose which tests run, each with its value:
    ``-m EXPR`` and ``-k EXPR`` as two words, ``--ignore``, ``--ignore-glob`` and
    ``--deselect`` as ``--name=value`` (a caller running elsewhere rebases the value).
    The rest (output, plugins, parallelism) is left to the caller."""
    words = _words(options.get("addopts"))
    kept: list[str] = []
    i = 0
    while i < len(words):
        word, value = words[i], words[i + 1] if i + 1 < len(words) else None
        name, eq, inline = word.partition("=")
        if name in _SELECTING and name.startswith("--") and (eq or value is not None):
            kept.append(f"{name}={inline if eq else value}")
            i += 0 if eq else 1
        elif word in ("-m", "-k") and value is not None:
            kept += [word, value]
            i += 1
        elif word[:2] in ("-m", "-k") and len(word) > 2:
            kept += [word[:2], word[2:]]
        i += 1
    return kept


def detect_layout(repo: Repo, rev: str) -> Layout:
    """The repository's pytest configuration at ``rev``, else :data:`DEFAULT_PATTERNS`."""
    for name in _CONFIG_FILES:
        data = repo.show(rev, name)
        if data is None:
            continue
        options = _pytest_section(name, data.decode("utf-8", errors="replace"))
        if options is None:
            continue
        patterns = patterns_from_pytest(options)
        if patterns:
            elsewhere = _outside_packages(repo, rev, options)
            source = f"{name} (testpaths/python_files)"
            if elsewhere:
                folders = sorted({p.split("/", 1)[0] for p in elsewhere})
                source += f", and python_files in {', '.join(folders)} (not packages)"
            return Layout(patterns + elsewhere, source)
    return Layout(DEFAULT_PATTERNS, "defaults")


class EmptyUniverse(ValueError):
    """No test to choose from: a selection would silently run nothing."""
