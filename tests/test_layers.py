"""The import graph follows the flow: no lower part imports a higher one.

Read from the source with ``ast`` (every import, at any depth, including those inside
functions), so a reversed import fails here before it becomes a cycle.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ci_relay", "test_selection", "reuse_specs", "spyre_emu")
HIGH = ("ci_relay.pipeline", "ci_relay.service", "ci_relay.cli")
EDGES = (
    "ci_relay.intake",
    "ci_relay.store",
    "ci_relay.execution",
    "ci_relay.reporting",
    "ci_relay.dashboard",
)
# ci_relay's flat modules, by floor (docs/architecture.md): the base imports only the
# libraries and each other; the base-with-store reads the store; the conductors sit with the CLI
FLAT_BASE = tuple(
    f"ci_relay.{m}"
    for m in (
        "settings", "runtime_defaults", "identifiers", "request_body", "policy", "logs",
        "metrics", "source_digest", "api_docs", "checkouts",
    )
)  # fmt: skip
FLAT_STORE = tuple(
    f"ci_relay.{m}" for m in ("context", "steps", "audit", "coverage_maps", "nightly")
)
FLAT_TOP = ("ci_relay.demo", "ci_relay.replay", "ci_relay.__main__")

# (importer prefix, forbidden import prefixes, why)
RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("test_selection", ("ci_relay",), "the selector is a library the relay uses"),
    ("reuse_specs", ("ci_relay",), "the spec library runs inside test processes"),
    ("spyre_emu", ("ci_relay",), "the emulator is a device, not part of the service"),
    (
        "reuse_specs",
        ("spyre_emu",),
        "the real card never needs the emulator: the emulator knows specs, not the reverse",
    ),
    # the selector's wings serve its stages: none reaches back to the conductor, and the
    # coverage map and the release upgrade know nothing of the rankings
    (
        "test_selection.ranking",
        ("test_selection.selector", "test_selection.evaluate", "test_selection.upgrade"),
        "the rankings serve the selector's stages",
    ),
    (
        "test_selection.coverage",
        (
            "test_selection.selector",
            "test_selection.evaluate",
            "test_selection.ranking",
            "test_selection.upgrade",
        ),
        "the coverage map is read by the rankings, never the reverse",
    ),
    (
        "test_selection.upgrade",
        (
            "test_selection.selector",
            "test_selection.evaluate",
            "test_selection.ranking",
            "test_selection.coverage",
        ),
        "the release upgrade stands apart from selection",
    ),
    ("ci_relay.intake", HIGH, "intake hands work on through ci_relay.steps"),
    ("ci_relay.reporting", HIGH, "reporting reads stored facts, never the steps"),
    ("ci_relay.dashboard", HIGH, "pages read the store"),
    (
        "ci_relay.store",
        (*HIGH, "ci_relay.intake", "ci_relay.reporting", "ci_relay.dashboard"),
        "the store is the bottom",
    ),
    ("ci_relay.execution", HIGH, "execution runs what the pipeline asks"),
    ("ci_relay.steps", HIGH, "the step protocol sits below the steps"),
    ("ci_relay.pipeline", ("ci_relay.service", "ci_relay.cli"), "the service runs the steps"),
    *(
        (m, (*HIGH, *EDGES, *FLAT_STORE, *FLAT_TOP), "the flat base needs no edge")
        for m in FLAT_BASE
    ),
    *(
        (
            m,
            (*HIGH, *(e for e in EDGES if e != "ci_relay.store"), *FLAT_TOP),
            "the flat modules over the store read it, and no other edge",
        )
        for m in FLAT_STORE
    ),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(module: str, source: str) -> Iterator[tuple[int, str]]:
    """Every module name ``source`` imports, absolute (relative imports resolved)."""
    package = module.rsplit(".", 1)[0] if "." in module else module
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:  # "from ci_relay import pipeline"
                yield node.lineno, f"{base}.{alias.name}"


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(module: str, source: str) -> list[str]:
    found = []
    for line, name in imports_of(module, source):
        for importer, forbidden, why in RULES:
            if _under(module, importer):
                for prefix in forbidden:
                    if _under(name, prefix):
                        found.append(f"{module}:{line} imports {name} ({why or 'lower layer'})")
    return found


def _sources() -> Iterator[tuple[str, str]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield _module_name(path), path.read_text(encoding="utf-8")


def test_no_lower_part_imports_a_higher_one() -> None:
    found = [v for module, source in _sources() for v in violations(module, source)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("ci_relay.intake.routes", "from ci_relay.pipeline import Next\n"),
        ("ci_relay.reporting.build", "def f():\n    from ci_relay import pipeline\n"),
        ("test_selection.selector", "import ci_relay.settings\n"),
        ("test_selection.ranking.choice", "from test_selection.selector import select\n"),
        ("test_selection.coverage.map", "from test_selection.ranking.allocation import MODEL\n"),
        ("test_selection.upgrade.release_diff", "from test_selection import selector\n"),
        ("reuse_specs.devices.spyre_card", "from spyre_emu.test_base import x\n"),
        ("reuse_specs.matching", "def f():\n    from spyre_emu.profile import SpyreProfile\n"),
        ("ci_relay.dashboard.queries", "from ..service.tasks import app\n"),
        ("ci_relay.settings", "from ci_relay.execution.runtimes import NOBODY\n"),
        ("ci_relay.identifiers", "from ci_relay.context import Context\n"),
        ("ci_relay.steps", "from ci_relay.intake.mount import install\n"),
    ],
)
def test_a_reversed_import_is_caught(module: str, source: str) -> None:
    assert violations(module, source)


def test_every_flat_module_has_a_floor() -> None:
    """A new flat module of ci_relay must be given a floor here (and in docs/architecture.md)."""
    flat = {f"ci_relay.{p.stem}" for p in (ROOT / "ci_relay").glob("*.py") if p.stem != "__init__"}
    assert flat == {*FLAT_BASE, *FLAT_STORE, *FLAT_TOP}


def test_loading_the_settings_loads_no_runtime_and_no_edge() -> None:
    """Settings are read by every process, the runner's included: they must stay a leaf."""
    import subprocess
    import sys

    code = (
        "import sys, ci_relay.settings; "
        "print(sorted(m for m in sys.modules if m.startswith('ci_relay.') "
        "and m not in ('ci_relay.settings', 'ci_relay.runtime_defaults')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_the_flow_downwards_is_allowed() -> None:
    assert not violations("ci_relay.pipeline", "from ci_relay.intake.events import summarize\n")
    assert not violations("ci_relay.intake.routes", "from ci_relay.steps import Next\n")


def test_the_runner_side_command_line_imports_no_server_library() -> None:
    """Shards run ``python -m ci_relay run`` in runner images that carry no database, broker
    or web libraries: importing the command line must not need them."""
    import subprocess
    import sys

    code = (
        "import sys, ci_relay.cli, ci_relay.execution.spec_run; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'alembic', 'sqlalchemy', 'celery', 'fastapi', 'redis', 'uvicorn'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", out.stdout


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120


def test_no_module_over_600_lines_and_no_function_over_120() -> None:
    """Sizes a newcomer can read (issue 46): a longer module or function is split by
    responsibility, not allowed here."""
    found = []
    for package in ("ci_relay", "test_selection", "reuse_specs", "spyre_emu", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            where = path.relative_to(ROOT)
            if (lines := source.count("\n")) > MAX_MODULE_LINES:
                found.append(f"{where}: {lines} lines")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    assert not found, "\n".join(found)


def _is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").is_file()


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules of ``modules`` it imports, at any depth (inside functions and
    under ``TYPE_CHECKING`` too). ``from P import x`` is an edge to ``P.x`` when that is a
    module, else to ``P``; the parent packages Python imports on the way are not edges (a
    package's ``__init__`` re-exporting its modules is not a circle)."""

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, source in modules.items():
        package = module if _is_package(module) else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(source)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    anchor = parts[: len(parts) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            graph[module].update(t for n in names if (t := owner(n)) and t != module)
    return graph


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (its modules in order, the first again at the end), or
    [] when there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))
    return []


def _bench_sources() -> Iterator[tuple[str, str]]:
    """bench/'s scripts import each other by file name (the folder is put on the path)."""
    for path in sorted((ROOT / "bench").glob("*.py")):
        yield path.stem, path.read_text(encoding="utf-8")


def test_no_import_circle_between_product_files_or_bench_scripts() -> None:
    for modules in (dict(_sources()), dict(_bench_sources())):
        found = circle(import_graph(modules))
        assert not found, "import circle: " + " -> ".join(found)


def test_an_import_circle_is_caught_even_inside_a_function() -> None:
    modules = {
        "ci_relay.intake.routes": "def install():\n    from ci_relay.intake import reruns\n",
        "ci_relay.intake.reruns": "from ci_relay.intake.routes import intake_of\n",
        "ci_relay.intake.wire": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from ci_relay.intake.reruns import RerunRequest\n",
    }
    found = circle(import_graph(modules))
    assert found[0] == found[-1] and set(found) == {
        "ci_relay.intake.routes",
        "ci_relay.intake.reruns",
    }
    # a package re-exporting its own modules is no circle; a module's own name neither
    package = {
        "ci_relay.cli": "from ci_relay.cli.main import app\n",
        "ci_relay.cli.main": "from ci_relay.cli import common\nimport ci_relay.cli.main\n",
        "ci_relay.cli.common": "",
    }
    assert not circle(import_graph(package))
