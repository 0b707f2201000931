"""Shards in real sandboxes (bubblewrap) and containers (Podman): faults cost one test, never
the shard's results, and hostile tests (privileges, writes, secrets, network, disk, fork
bomb) fail or are killed without getting out."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ci_relay.execution import runtimes
from ci_relay.execution.runtimes import (
    MAX_OUTPUT_BYTES,
    Invocation,
    Limits,
    LocalRuntime,
    RuntimeOptions,
    RuntimeUnavailable,
    SandboxRuntime,
    get_runtime,
    scratch_usage,
)
from ci_relay.execution.shard import ShardReport, ShardRequest, run_shard
from test_selection.coverage.map import read_streams
from tests.conftest import CliResult

pytestmark = pytest.mark.slow
FAULTS = Path(__file__).parent / "data" / "faults"
SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_faults.py
      unlisted_test_mode: mandatory_success
"""
NAMES = [
    "test_a_ok",
    "test_b_segfault",
    "test_c_ok",
    "test_d_hang",
    "test_e_network",
    "test_f_secret",
    "test_g_write_outside",
    "test_h_memory",
    "test_i_flaky",
    "test_j_ok",
    "test_k_raise_privileges",
    "test_l_ok",
    "test_m_write_outside_scratch",
    "test_n_ok",
    "test_o_read_worker_secrets",
    "test_p_ok",
    "test_q_reach_the_network",
    "test_r_ok",
]
ESCAPE_NAMES = [  # a shard of their own, with a 64 MB scratch quota
    "test_s_disk_one_file",
    "test_t_ok_scratch_freed",
    "test_u_disk_many_files",
    "test_v_ok_scratch_freed",
    "test_w_disk_deleted_files",
    "test_x_ok_scratch_freed",
    "test_y_file_past_its_limit",
    "test_z_ok",
    "test_za_fork_bomb",
    "test_zb_ok_after_fork_bomb",
]
ESCAPE_QUOTA_MB = 64
ESCAPE_TIMEOUT = 10  # the fork bomb holds until then; the disk writers are stopped long before
SECRET = f"ci-relay-test-secret-{secrets.token_hex(8)}"  # known to the worker only


class Faults:
    """A copy of the fault suite's upstream, plus the worker's own secrets: a root-owned 0600
    settings file under /etc (bound into the sandbox), a token file and a data folder inside
    the upstream tree (bound into both runtimes), all hidden from the runtime."""

    def __init__(self, root: Path, runtime: str) -> None:
        self.upstream = root / "up"
        shutil.copytree(FAULTS, self.upstream)
        self.spec = root / "spec.yaml"
        self.spec.write_text(SPEC)
        etc = Path(f"/etc/ci-relay-faults-{runtime}")
        self.settings_dir = etc if os.geteuid() == 0 else root / "etc"
        self.settings_dir.mkdir(mode=0o700, exist_ok=True)
        self.settings = self.settings_dir / "settings.env"
        self.settings.write_text(f"CI_RELAY_WEBHOOK_SECRET={SECRET}\n")
        self.settings.chmod(0o600)
        self.token = self.upstream / "test" / ".worker-token"
        self.token.write_text(SECRET)
        self.token.chmod(0o644)  # readable by anyone: only the mask keeps it from a test
        self.data = self.upstream / "test" / ".relay-data"
        self.data.mkdir()
        (self.data / "key.pem").write_text(SECRET)
        self.hidden = (self.settings, self.token, self.data)

    def env(self) -> dict[str, str]:
        return {
            "FAULTS_SECRET_PATHS": os.pathsep.join(
                str(p) for p in (self.settings, self.token, self.data / "key.pem")
            ),
            "FAULTS_WORKER_HOME": str(Path.home()),
            "FAULTS_SCRATCH_MB": str(ESCAPE_QUOTA_MB),
        }

    def remove(self) -> None:
        shutil.rmtree(self.settings_dir, ignore_errors=True)


@pytest.fixture(scope="module", params=["sandbox", "container"])
def sandbox_report(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ShardReport:
    """The fault suite in each isolating runtime (the container one on Podman, for real)."""
    faults = Faults(tmp_path_factory.mktemp(f"faults-{request.param}"), request.param)
    os.environ["MY_SECRET"] = "worker-secret"  # in the worker's environment, never the shard's
    try:
        shard = ShardRequest(
            tests=[f"test/test_faults.py::TestFaults::{n}" for n in NAMES],
            specs=[faults.spec],
            upstream=faults.upstream,
            scratch=faults.upstream.parent / "scratch",
            per_test_timeout=10,
            limits=Limits(memory_mb=1536, pids=256, wall_seconds=600),
            env=faults.env(),
            record_coverage=True,  # the relay's nightly records: it must survive all of this
        )
        runtime = get_runtime(request.param, options=RuntimeOptions(hidden=faults.hidden))
        return run_shard(runtime, shard)
    finally:
        del os.environ["MY_SECRET"]
        faults.remove()


@pytest.fixture(scope="module", params=["sandbox", "container"])
def escape_report(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ShardReport, Path]]:
    """Disk filling and a fork bomb, in a shard with a 64 MB scratch quota; and its scratch."""
    name = f"escape-{request.param}"
    faults = Faults(tmp_path_factory.mktemp(name), name)
    scratch = faults.upstream.parent / "scratch"
    try:
        shard = ShardRequest(
            tests=[f"test/test_faults.py::TestFaults::{n}" for n in ESCAPE_NAMES],
            specs=[faults.spec],
            upstream=faults.upstream,
            scratch=scratch,
            per_test_timeout=ESCAPE_TIMEOUT,
            limits=Limits(memory_mb=1536, pids=128, wall_seconds=900, scratch_mb=ESCAPE_QUOTA_MB),
            env=faults.env(),
        )
        yield run_shard(get_runtime(request.param), shard), scratch
    finally:
        faults.remove()


def _outcome(report: ShardReport, name: str) -> tuple[str, str]:
    record = report.results[f"test/test_faults.py::TestFaults::{name}"]
    return record.outcome, record.message


def test_every_test_has_a_result(sandbox_report: ShardReport) -> None:
    assert sorted(n.rsplit("::", 1)[1] for n in sandbox_report.results) == NAMES
    assert _outcome(sandbox_report, "test_a_ok")[0] == "passed"
    assert _outcome(sandbox_report, "test_c_ok")[0] == "passed"  # after the segfault
    assert _outcome(sandbox_report, "test_j_ok")[0] == "passed"  # after the hang
    assert sandbox_report.error is None


def test_coverage_is_recorded_across_crashes_and_restarts(sandbox_report: ShardReport) -> None:
    """Each test process appends its tests' records as they end: the tests before a crash,
    and those of the processes forked (or started) after it, all reach the map."""
    streams = sandbox_report.coverage_streams
    cmap, skipped = read_streams(streams, "o/faults", "f" * 40, "cpu")
    pids = {
        json.loads(line)["pid"]
        for path in streams
        for line in path.read_text().splitlines()
        if line.startswith("{")
    }
    assert len(pids) >= 3, pids  # the segfault and the hang each cost a test process
    for name in ("test_a_ok", "test_c_ok", "test_j_ok", "test_r_ok"):
        test = f"test/test_faults.py::TestFaults::{name}"
        assert cmap.tests[test] == {("test/test_faults.py", f"TestFaults.{name}"): 1}, test
    assert "test/test_faults.py::TestFaults::test_b_segfault" not in cmap.tests  # died in it
    assert skipped == 0


def test_a_segfault_is_recorded_as_crashed(sandbox_report: ShardReport) -> None:
    assert _outcome(sandbox_report, "test_b_segfault") == (
        "crashed",
        "the test process died of SIGSEGV",
    )


def test_a_hang_is_killed_at_its_timeout(sandbox_report: ShardReport) -> None:
    outcome, message = _outcome(sandbox_report, "test_d_hang")
    assert outcome == "crashed" and "longer than its 10s timeout" in message


def test_no_network_no_secrets_read_only_root(sandbox_report: ShardReport) -> None:
    outcome, message = _outcome(sandbox_report, "test_e_network")
    assert outcome == "failed" and "Connection refused" in message  # Redis listens outside only
    assert _outcome(sandbox_report, "test_f_secret")[0] == "passed"
    outcome, message = _outcome(sandbox_report, "test_g_write_outside")
    assert outcome == "failed" and "Read-only file system" in message
    assert not Path("/etc/ci-relay-should-not-exist").exists()


def test_memory_limit_stops_the_allocation(sandbox_report: ShardReport) -> None:
    outcome, message = _outcome(sandbox_report, "test_h_memory")
    assert outcome in ("failed", "crashed") and ("MemoryError" in message or "died" in message)


def test_failures_are_rerun_once_to_find_flakes(sandbox_report: ShardReport) -> None:
    record = sandbox_report.results["test/test_faults.py::TestFaults::test_i_flaky"]
    # a crash's details hold the stack it died with: where it stood, and the frames under it
    why = f"{record.outcome}: {record.message}\n{record.details[:3000]}"
    assert record.outcome == "passed" and record.flaky and "flaky" in record.message, why


def _refused(report: ShardReport, name: str) -> str:
    """A hostile test's message; it must have failed (every attempt refused) and the plain
    test after it passed."""
    outcome, message = _outcome(report, name)
    assert outcome == "failed", (name, outcome, message)
    following = NAMES[NAMES.index(name) + 1]
    assert _outcome(report, following)[0] == "passed", following
    return message


def test_no_privileges_to_gain(sandbox_report: ShardReport) -> None:
    message = _refused(sandbox_report, "test_k_raise_privileges")
    assert message.startswith(
        "AssertionError: refused: setuid EPERM, setgid EPERM, setgroups EPERM, chroot EPERM; uid "
    )
    assert "uid 0;" not in message
    for field in ("CapEff", "CapPrm", "CapBnd"):
        assert f"{field} 0000000000000000" in message
    assert "NoNewPrivs 1" in message


def test_nothing_outside_scratch_is_writable(sandbox_report: ShardReport) -> None:
    message = _refused(sandbox_report, "test_m_write_outside_scratch")
    targets = message.removeprefix("AssertionError: refused: ").split(", ")
    assert [t.split()[0] for t in targets] == ["etc", "upstream", "home", "python", "usr"]
    assert all(t.split()[1] in ("EROFS", "EACCES") for t in targets), message
    assert dict(t.split() for t in targets)["upstream"] == "EROFS"
    for planted in (
        Path("/etc/ci-relay-planted"),
        Path.home() / "ci-relay-planted",
        Path("/usr/lib/ci-relay-planted"),
    ):
        assert not planted.exists()
    torch = importlib.util.find_spec("torch")
    assert torch is not None and torch.origin is not None
    assert not (Path(torch.origin).parent / "planted.py").exists()
    assert not (FAULTS / "test" / "planted.py").exists()


def test_the_workers_secrets_stay_unreadable(
    sandbox_report: ShardReport, request: pytest.FixtureRequest
) -> None:
    message = _refused(sandbox_report, "test_o_read_worker_secrets")
    items = message.removeprefix("AssertionError: read: ").split(", ")
    read = dict(item.split(" ", 1) for item in items[:4])
    sandbox = request.node.callspec.params["sandbox_report"] == "sandbox"
    # /dev/null over it: bwrap binds it nodev (EACCES, though the file is 0644), Podman not
    assert read[".worker-token"] == ("EACCES" if sandbox else "0 bytes"), message
    # in /etc, which the sandbox binds (masked); not in the container's image
    assert read["settings.env"] == ("EACCES" if sandbox else "ENOENT"), message
    # an empty folder over the data folder: root's 0700 tmpfs, or an empty bind
    assert read["key.pem"] == ("EACCES" if sandbox else "ENOENT"), message
    assert read["pyproject.toml"] == "ENOENT", message  # the repository is not bound
    assert "environ " in message and "readable" in message
    everything = [r.message + r.details for r in sandbox_report.results.values()]
    everything += sandbox_report.log
    for text in everything:
        assert SECRET not in text and "worker-secret" not in text


def test_no_network_and_no_engine_socket(sandbox_report: ShardReport) -> None:
    message = _refused(sandbox_report, "test_q_reach_the_network")
    assert message == (
        "AssertionError: refused: gateway none, redis ECONNREFUSED, podman ENOENT, "
        "outside ENETUNREACH"
    )


def _escape(report: ShardReport, name: str) -> tuple[str, str, str]:
    record = report.results[f"test/test_faults.py::TestFaults::{name}"]
    return record.outcome, record.message, record.details


def test_every_escape_test_has_a_result(escape_report: tuple[ShardReport, Path]) -> None:
    report, _scratch = escape_report
    assert sorted(n.rsplit("::", 1)[1] for n in report.results) == ESCAPE_NAMES
    assert report.error is None
    for name in ESCAPE_NAMES:
        if "_ok" in name:  # each after a hostile test: it still runs, and passes
            outcome, message, details = _escape(report, name)
            assert outcome == "passed", (name, message, details)


def test_filling_the_disk_is_stopped_and_the_space_freed(
    escape_report: tuple[ShardReport, Path],
) -> None:
    report, scratch = escape_report
    quota_kill = (
        f"the test wrote more than {ESCAPE_QUOTA_MB} MB to its scratch folder and was killed"
    )
    for name in ("test_s_disk_one_file", "test_u_disk_many_files", "test_w_disk_deleted_files"):
        outcome, message, details = _escape(report, name)
        assert (outcome, message) == ("crashed", quota_kill), (name, details)
    outcome, message, _details = _escape(report, "test_y_file_past_its_limit")
    assert outcome == "failed" and "[Errno 27] File too large" in message
    used, _entries = scratch_usage(scratch)
    assert used < 4 * 1024 * 1024  # the writers' files are gone
    assert {p.name for p in scratch.iterdir()} >= {"work", "specs", "progress-1.jsonl"}


def test_a_fork_bomb_is_contained(escape_report: tuple[ShardReport, Path]) -> None:
    report, _scratch = escape_report
    outcome, message, details = _escape(report, "test_za_fork_bomb")
    assert outcome == "crashed" and f"longer than its {ESCAPE_TIMEOUT}s timeout" in message
    assert "in test_za_fork_bomb" in details  # refused and holding on: killed at its timeout
    after = report.results["test/test_faults.py::TestFaults::test_zb_ok_after_fork_bomb"]
    # none left over: at once, in the process forked after the bomb's (not only on a rerun)
    assert (after.outcome, after.flaky) == ("passed", False), after.message


@pytest.mark.parametrize("name", ["sandbox", "container"])
def test_output_is_bounded(name: str, tmp_path: Path) -> None:
    """A process printing 64 MB: the runtime keeps its head and its tail, no more."""
    runtime = get_runtime(name)
    upstream = tmp_path / "up"
    upstream.mkdir()
    upstream.chmod(0o755)
    code = (
        "import sys\n"
        "sys.stdout.write('FIRST LINE\\n')\n"
        "for i in range(64 * 1024):\n"
        "    sys.stdout.write(f'{i:08d}' + 'x' * 1015 + '\\n')\n"
        "sys.stdout.write('LAST LINE\\n')\n"
        "sys.exit(3)\n"
    )
    done = runtime.run(Invocation([runtime.python, "-c", code], upstream, tmp_path / "scratch"))
    assert done.returncode == 3 and not done.timed_out and done.killed_for is None
    assert len(done.output.encode()) <= MAX_OUTPUT_BYTES + 100
    assert "bytes of output cut]" in done.output
    assert done.output.endswith("LAST LINE\n")
    if name == "sandbox":  # the container engine keeps only its last megabytes itself
        assert done.output.startswith("FIRST LINE\n00000000x")


def test_sandbox_binds_only_what_the_child_needs(tmp_path: Path) -> None:
    hidden = Path("/etc/hostname") if Path("/etc/hostname").is_file() else Path("/etc/passwd")
    runtime = SandboxRuntime(uid=65534, gid=65534, hidden=[hidden, tmp_path / "elsewhere"])
    inv = Invocation(["python"], tmp_path / "up", tmp_path / "scratch")
    argv = runtime.command(inv, {"PATH": "/usr/bin"})
    pairs = list(zip(argv, argv[1:], argv[2:], strict=False))
    binds = {(a, b) for flag, a, b in pairs if flag in ("--ro-bind", "--bind") and a == b}
    assert ("/", "/") not in binds and ("/usr", "/usr") in binds and ("/etc", "/etc") in binds
    assert (str(tmp_path / "scratch"),) * 2 in binds and (str(tmp_path / "up"),) * 2 in binds
    repo = Path(runtimes.__file__).resolve().parents[3]  # runtimes/__init__.py
    assert (str(repo),) * 2 not in binds  # the repository (with .ci-relay/) is not bound
    assert (str(repo / "ci_relay"),) * 2 in binds  # only the packages the child imports
    assert ("--ro-bind", "/dev/null", str(hidden)) in pairs  # masked
    assert str(tmp_path / "elsewhere") not in argv  # not under a bound folder: nothing to mask
    assert "--clearenv" in argv and "--unshare-net" in argv and "--die-with-parent" in argv
    if os.geteuid() == 0:
        assert argv[argv.index("--cap-drop") + 1] == "ALL"
        tail = argv[argv.index("--") + 1 :]
        assert tail[0].endswith("setpriv") and "--reuid=65534" in tail
        assert "--bounding-set=-all" in tail and "--inh-caps=-all" in tail
    prlimit = argv[argv.index("--fsize=2147483648") - 3 :]
    assert prlimit[0].endswith("prlimit") and "--core=0" in prlimit


@pytest.mark.parametrize("asked", [None, "ACTIVE"])
def test_openmp_workers_sleep_in_a_shard_unless_asked_to_spin(
    asked: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: a spinning OpenMP worker took the tests' core on a loaded machine. The
    child sees PASSIVE unless the worker's environment (here) or the request names one."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if asked is not None:
        monkeypatch.setenv("OMP_WAIT_POLICY", asked)
    (tmp_path / "up").mkdir(mode=0o755)
    probe = "import os; print('policy=' + os.environ.get('OMP_WAIT_POLICY', 'unset'))"
    runtime = get_runtime("sandbox", "cpu")
    done = runtime.run(Invocation([runtime.python, "-c", probe], tmp_path / "up", tmp_path / "s"))
    assert done.returncode == 0, done.output
    assert f"policy={asked or 'PASSIVE'}" in done.output
    other = "PASSIVE" if asked == "ACTIVE" else "ACTIVE"  # a request's env wins over both
    env = {"OMP_WAIT_POLICY": other}
    inv = Invocation([runtime.python, "-c", probe], tmp_path / "up", tmp_path / "s", env)
    assert f"policy={other}" in runtime.run(inv).output


def test_sandbox_refuses_without_its_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    for tool, why in (("bwrap", "bubblewrap is not installed"), ("prlimit", "prlimit is missing")):
        monkeypatch.setattr(
            shutil, "which", lambda name, t=tool: None if name == t else real_which(name)
        )
        with pytest.raises(RuntimeUnavailable, match=why):
            SandboxRuntime().check()
    if os.geteuid() == 0:
        monkeypatch.setattr(
            shutil, "which", lambda name: None if name == "setpriv" else real_which(name)
        )
        with pytest.raises(RuntimeUnavailable, match="setpriv is missing"):
            SandboxRuntime().check()
        with pytest.raises(RuntimeUnavailable, match="must not be root"):
            SandboxRuntime(uid=0)


def test_local_runtime_also_survives_a_crash(tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    shutil.copytree(FAULTS, upstream)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    request = ShardRequest(
        tests=[
            f"test/test_faults.py::TestFaults::{n}"
            for n in ("test_a_ok", "test_b_segfault", "test_c_ok")
        ],
        specs=[spec],
        upstream=upstream,
        scratch=tmp_path / "s",
        per_test_timeout=30,
    )
    report = run_shard(LocalRuntime(), request)
    assert [r.outcome for r in report.results.values()] == ["passed", "crashed", "passed"]
    assert report.processes == 1  # the child restarted its own test process after the crash
    crashed = report.results["test/test_faults.py::TestFaults::test_b_segfault"]
    assert crashed.details.startswith("the test process died of SIGSEGV\n\n")
    assert "Fatal Python error: Segmentation fault" in crashed.details
    assert "in test_b_segfault" in crashed.details  # faulthandler's stack of the dying test


def test_a_shard_that_runs_none_of_its_tests_is_an_error_not_a_pass(tmp_path: Path) -> None:
    """Fail closed: a child that selects nothing (a broken runner, renamed tests) must not
    let the run conclude success on zero results."""
    upstream = tmp_path / "up"
    shutil.copytree(FAULTS, upstream)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    request = ShardRequest(
        tests=["test/test_faults.py::TestFaults::test_that_is_not_there"],
        specs=[spec],
        upstream=upstream,
        scratch=tmp_path / "s",
        per_test_timeout=30,
    )
    report = run_shard(LocalRuntime(), request)
    assert report.results == {}
    assert report.error is not None and report.error.startswith(
        "the shard ran none of its 1 test(s) (exit 4)"
    )


def test_missing_image_names_the_build_command() -> None:
    with pytest.raises(
        RuntimeUnavailable,
        match=r":src-[0-9a-f]{16} is missing: build it with `ci-relay images build --backend no-such-backend`",
    ):
        get_runtime("container", backend="no-such-backend")


@pytest.mark.parametrize("runtime", ["sandbox", "container"])
def test_run_with_a_runtime_from_the_cli(
    runtime: str, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    upstream = tmp_path / "up"
    shutil.copytree(FAULTS, upstream)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("mandatory_success", "xfail"))
    tests = tmp_path / "tests.txt"
    tests.write_text(
        "test/test_faults.py::TestFaults::test_a_ok\ntest/test_faults.py::TestFaults::test_b_segfault\n"
    )
    junit = tmp_path / "j.xml"
    result = cli(
        "run",
        "--spec",
        spec,
        "--upstream",
        upstream,
        "--runtime",
        runtime,
        "--tests",
        tests,
        "--junit",
        junit,
    )
    assert result.code == 1, result.output  # a crash is never an expected outcome
    assert "CRASHED test/test_faults.py::TestFaults::test_b_segfault" in result.stdout
    assert f"{runtime}: 1 process(es), 1 crashed" in result.stdout
    text = junit.read_text()
    assert 'type="crashed"' in text and 'name="test_a_ok"' in text
    unknown = cli("run", "--spec", spec, "--upstream", upstream, "--runtime", "vm")
    assert unknown.code == 2 and "unknown runtime 'vm'" in unknown.stderr


CRASHES = """
import ctypes
import os
import unittest

with open({imports!r}, "a") as log:  # each collection imports the file once
    log.write("imported\\n")


class TestCrashes(unittest.TestCase):
    def test_a(self):
        pass

    def test_b(self):
        ctypes.string_at(0)

    def test_c(self):
        os._exit(7)

    def test_d(self):
        os.abort()

    def test_e(self):
        pass
"""


def _one_file_upstream(tmp_path: Path, name: str, source: str) -> tuple[Path, Path]:
    """An upstream tree holding test/NAME with SOURCE, and a spec that runs that file
    (unlisted tests must pass); returns (upstream, spec)."""
    upstream = tmp_path / "up"
    (upstream / "test").mkdir(parents=True)
    (upstream / "test" / name).write_text(source)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("test_faults.py", name))
    return upstream, spec


def test_a_crash_costs_one_test_not_a_collection(tmp_path: Path) -> None:
    """Issue 27 item 7: three crashing tests in one file, and the file is collected once; each
    crash is recorded with its own reason and the tests after it run in a test process
    forked from the collected one (the shard runner restarted the child, which collected the
    whole file again, per crash)."""
    imports = tmp_path / "imports.txt"
    source = CRASHES.format(imports=str(imports))
    upstream, spec = _one_file_upstream(tmp_path, "test_crashes.py", source)
    request = ShardRequest(
        tests=[f"test/test_crashes.py::TestCrashes::test_{n}" for n in "abcde"],
        specs=[spec],
        upstream=upstream,
        scratch=tmp_path / "s",
        per_test_timeout=30,
    )
    report = run_shard(LocalRuntime(), request)
    outcomes = {k.rsplit("_", 1)[-1]: r for k, r in report.results.items()}
    assert [outcomes[n].outcome for n in "abcde"] == [
        "passed",
        "crashed",
        "crashed",
        "crashed",
        "passed",
    ]
    assert outcomes["b"].message == "the test process died of SIGSEGV"
    assert "Fatal Python error: Segmentation fault" in outcomes["b"].details
    assert "in test_b" in outcomes["b"].details  # faulthandler's stack of the dying test
    assert outcomes["c"].message == "the test process exited with status 7 mid-test"
    assert outcomes["d"].message == "the test process died of SIGABRT"
    assert imports.read_text().count("imported") == 1
    assert report.processes == 1


@pytest.mark.parametrize("at_most, processes", [(3, 2), (2, 1)])
def test_many_failures_are_not_rerun_for_flakes(
    tmp_path: Path, at_most: int, processes: int
) -> None:
    """Three must-pass failures: rerun when the cap allows three, else left as failures
    and the log says why (hundreds of failures are not flakes; a rerun would cost a
    second collection and every failing test again)."""
    body = "import unittest\n\n\nclass TestMany(unittest.TestCase):\n"
    body += "".join(f"    def test_{n}(self):\n        self.fail('no')\n\n" for n in "abc")
    upstream, spec = _one_file_upstream(tmp_path, "test_many.py", body)
    request = ShardRequest(
        tests=[f"test/test_many.py::TestMany::test_{n}" for n in "abc"],
        specs=[spec],
        upstream=upstream,
        scratch=tmp_path / "s",
        rerun_at_most=at_most,
    )
    report = run_shard(LocalRuntime(), request)
    assert [r.outcome for r in report.results.values()] == ["failed"] * 3
    assert report.processes == processes
    said = "3 must-pass failures, more than 2: not rerun to look for flakes"
    assert (said in report.log) is (processes == 1)


FIRST_IMPORTS = """
import os
import sys

from torch.testing._internal.common_utils import TestCase  # its run() imports torch._dynamo


def test_a_first_in_its_process():
    assert "torch._dynamo" in sys.modules, "torch._dynamo is not imported yet"


def test_b_crash():
    os._exit(9)


def test_c_first_after_the_crash():
    assert "torch._dynamo" in sys.modules, "torch._dynamo is not imported yet"


class TestLater(TestCase):
    def test_d(self):
        pass
"""


def test_what_a_first_test_imports_is_imported_once_before_the_forks(tmp_path: Path) -> None:
    """torch's TestCase imports torch._dynamo (seconds) when it runs its first test; the
    supervisor imports it before forking, so no test process (the first, or the one after a
    crash) pays it again inside a test's timeout."""
    upstream, spec = _one_file_upstream(tmp_path, "test_first.py", FIRST_IMPORTS)
    names = ["test_a_first_in_its_process", "test_b_crash", "test_c_first_after_the_crash"]
    request = ShardRequest(
        tests=[f"test/test_first.py::{n}" for n in names]
        + ["test/test_first.py::TestLater::test_d"],
        specs=[spec],
        upstream=upstream,
        scratch=tmp_path / "s",
        per_test_timeout=60,
    )
    report = run_shard(LocalRuntime(), request)
    got = {k.split("::")[-1]: (r.outcome, r.message) for k, r in report.results.items()}
    assert got == {
        "test_a_first_in_its_process": ("passed", ""),
        "test_b_crash": ("crashed", "the test process exited with status 9 mid-test"),
        "test_c_first_after_the_crash": ("passed", ""),
        "test_d": ("passed", ""),
    }
    assert report.processes == 1


LEFTOVERS = """
import os
import subprocess
import sys
import time
import unittest

PIDS = {pids!r}


class TestLeftovers(unittest.TestCase):
    def test_a_start_a_daemon_then_hang(self):
        daemon = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True
        )
        with open(PIDS, "w") as out:
            out.write(str(daemon.pid))
        time.sleep(3600)  # killed at its timeout; its daemon is in another session

    def test_b_nothing_left(self):
        with open(PIDS) as saved:
            pid = int(saved.read())
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{{pid}}/stat") as stat:
            self.fail(f"the daemon {{pid}} is still here: {{stat.read()}}")
"""


def test_what_a_dead_test_left_running_is_ended_before_the_next_test(tmp_path: Path) -> None:
    """A test that started a daemon (its own session, so no process group reaches it) and
    then timed out: the supervisor is the daemon's subreaper and ends it before it forks the
    next test process."""
    pids = tmp_path / "daemon.pid"
    source = LEFTOVERS.format(pids=str(pids))
    upstream, spec = _one_file_upstream(tmp_path, "test_leftovers.py", source)
    names = ["test_a_start_a_daemon_then_hang", "test_b_nothing_left"]
    request = ShardRequest(
        tests=[f"test/test_leftovers.py::TestLeftovers::{n}" for n in names],
        specs=[spec],
        upstream=upstream,
        scratch=tmp_path / "s",
        per_test_timeout=5,
        rerun_failures=False,
    )
    try:
        report = run_shard(LocalRuntime(), request)
        got = {k.rsplit("::", 1)[1]: (r.outcome, r.message) for k, r in report.results.items()}
        assert got["test_a_start_a_daemon_then_hang"][0] == "crashed"
        assert got["test_b_nothing_left"] == ("passed", ""), got
        assert report.processes == 1
    finally:  # never leave it running, whatever happened
        if pids.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pids.read_text()), signal.SIGKILL)
