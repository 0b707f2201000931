"""Shared fixtures: a real sample upstream git repo, spec writers and the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ci_relay.sample_upstream import SampleUpstream, build_sample_upstream
from tests.outside_reads import OutsideReadGuard

pytest_plugins = ["tests.relay_fixtures"]

# tests/data holds upstream-shaped test files (one segfaults on purpose): inputs, not our tests
collect_ignore = ["data"]

REPO_ROOT = Path(__file__).resolve().parent.parent
# every file the suite reads is inside the checkout (tests/outside_reads.py says why)
OUTSIDE_READS = OutsideReadGuard(REPO_ROOT)
OUTSIDE_READS.install()
BUNDLED_SPECS = REPO_ROOT / "reuse_specs" / "specs"
CONTAINER_FIXTURES = frozenset({"engine"})  # a Podman client on the runner image
BROWSER_FIXTURES = frozenset({"browser", "watched"})
# what runs upstream tests in a real pytest session (or torch's op samples in a child):
# whole modules, module fixtures, and single tests; the --quick loop leaves them out
UPSTREAM_MODULES = frozenset(
    f"tests/test_{name}.py"
    for name in (
        "spyre_emu_backend",
        "labels",
        "input_generation",
        "op_includes",
        "profile_parity",
        "hardware_generic",
        "cpu_move",
        "collection_errors",
        "real_tree",
    )
)
UPSTREAM_FIXTURES = frozenset({"triaged", "shard_run"})
UPSTREAM_TESTS = frozenset(
    {
        "tests/test_nightly.py::test_the_nightly_runs_once_a_day_and_reports_as_crcr_expects",
        "tests/test_upgrade.py::test_upgrade_on_the_sample_upstream",
        "tests/test_spyre_emu.py::test_second_process_opening_the_device_gets_a_clear_error",
        "tests/test_cli_specs.py::test_spec_drift_never_blocks_a_run",
        "tests/test_workflows.py::test_the_dispatch_job_on_a_closed_pull_request_reports_skipped",
        # `specs profile-check` traces each OpInfo's sample inputs in the CLI's process
        "tests/test_published_profile.py::test_the_published_list_checks_clean_against_the_default_profile",
        "tests/test_published_profile.py::test_a_kernel_or_aten_name_the_profile_refuses_is_an_error",
    }
)


def _xdist_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses a fixture set up once per module (a served relay,
    a finished run, a browser), so the set-up is paid once: its module, and the parameter of
    each parametrized module-scoped fixture it uses, so different instances (the fault suite
    in the sandbox, the same in a container) run on different workers at once. None for a
    test without such set-up, or in a module that sets ``SPREAD_OVER_WORKERS``."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None or getattr(getattr(item, "module", None), "SPREAD_OVER_WORKERS", False):
        return None
    scoped = sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope in ("module", "class")
    )
    if not scoped:
        return None
    group = item.nodeid.split("::", 1)[0]
    spec = getattr(item, "callspec", None)
    for name in scoped:
        if spec is not None and name in spec.indices:
            group += f"|{name}#{spec.indices[name]}"
    return group


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its hook names them)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark what needs a container image or a browser (``scripts/test.sh --quick`` leaves
    them out): a test run once per runtime with ``container``, or one using a fixture that
    needs either; tests that start their own say so with the marker themselves. Tests of a
    module with module-scoped set-up share an xdist group (unless the module sets
    ``SPREAD_OVER_WORKERS``: its set-up is cheap next to its tests); the rest spread."""
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        spec = getattr(item, "callspec", None)
        names = set(getattr(item, "fixturenames", ()))
        if (spec is not None and "container" in list(spec.params.values())) or (
            names & CONTAINER_FIXTURES
        ):
            item.add_marker(pytest.mark.container)
        if names & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)
        module, _, _rest = item.nodeid.partition("::")
        if (
            module in UPSTREAM_MODULES
            or names & UPSTREAM_FIXTURES
            or item.nodeid.split("[", 1)[0] in UPSTREAM_TESTS
        ):
            item.add_marker(pytest.mark.slow)


def worker_index() -> int:
    """This pytest-xdist worker's number (0 without xdist): per-worker resources by name."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw")) if name.removeprefix("gw").isdigit() else 0


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker gets its own emulated Spyre card (the card serves one process at a
    time): tests on different workers that run upstream tests on it never meet on its lock.
    Child processes inherit the folder; a folder the person running the suite set is kept.
    The controller configures first and its workers inherit its environment, so a folder this
    hook chose (its prefix) is replaced on each worker rather than taken as the person's."""
    ours = Path(tempfile.gettempdir()) / f"spyre-emu-{os.getuid()}-pytest-"
    current = os.environ.get("SPYRE_EMU_LOCK_DIR", "").strip()
    if current and not current.startswith(str(ours)):
        return
    given = getattr(config, "workerinput", {})  # xdist: this worker's id and the run's
    run = given.get("testrunuid", str(os.getpid()))[:12]  # two suites on one machine differ
    os.environ["SPYRE_EMU_LOCK_DIR"] = f"{ours}{run}-{given.get('workerid', 'main')}"


@pytest.fixture(autouse=True)
def _reads_nothing_beside_the_checkout() -> Iterator[None]:
    """Fail a test that read a file beside the checkout, even if it caught the error."""
    before = len(OUTSIDE_READS.seen)
    yield
    if len(OUTSIDE_READS.seen) > before:
        pytest.fail(f"read outside the checkout: {OUTSIDE_READS.seen[before:]}")


@pytest.fixture(scope="session")
def sample_upstream(tmp_path_factory: pytest.TempPathFactory) -> SampleUpstream:
    return build_sample_upstream(tmp_path_factory.mktemp("sample") / "upstream")


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """Write a spec file from an indented YAML string; returns its path."""
    counter = iter(range(1000))

    def write(text: str, name: str | None = None) -> Path:
        path = tmp_path / (name or f"spec{next(counter)}.yaml")
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., CliResult]:
    """Run the real ``ci-relay`` command line in a subprocess."""

    def run(*args: str | Path, env: dict[str, str] | None = None) -> CliResult:
        # the caller's own upstream and spec label would change what the command does
        ambient = ("TORCH_ROOT", "TORCH_SPYRE_TEST_TYPE")
        full_env = {k: v for k, v in os.environ.items() if k not in ambient}
        full_env["COLUMNS"] = "200"
        if not full_env.get("PYTHONPYCACHEPREFIX"):  # else bytecode goes there, not in trees
            full_env["PYTHONDONTWRITEBYTECODE"] = "1"
        full_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "ci_relay", *map(str, args)],
            capture_output=True,
            text=True,
            env=full_env,
            cwd=tmp_path,
            timeout=600,
            check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def tiny_upstream(tmp_path: Path) -> Callable[[dict[str, str]], Path]:
    """A throwaway upstream tree with the given test files (relative path -> source)."""

    def make(files: dict[str, str]) -> Path:
        root = tmp_path / "tiny-upstream"
        for rel, source in files.items():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
        return root

    return make
