"""The progress log costs one write per test and no thread per test (issue 37), and still
loses no finished result when the process dies, and still kills a hang at its timeout.

Each test runs a real pytest process with the plugin, as the shard child does; a conftest
in the upstream folder counts the plugin's writes and the watchdog's arms (the plugin looks
both up at call time)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ci_relay.execution.crashes import TIMEOUT_MARK, ProgressReader

REPO = Path(__file__).resolve().parent.parent
COUNTING_CONFTEST = """
import faulthandler, json, os

counts = {"writes": 0, "arms": 0}
_write, _arm = os.write, faulthandler.dump_traceback_later


def counting_write(fd, data):
    if bytes(data[:9]) == b'{"event":':
        counts["writes"] += 1
    return _write(fd, data)


def counting_arm(*args, **kwargs):
    counts["arms"] += 1
    return _arm(*args, **kwargs)


os.write, faulthandler.dump_traceback_later = counting_write, counting_arm


def pytest_unconfigure(config):
    with open(os.environ["COUNTS_FILE"], "w") as out:
        json.dump(counts, out)
"""


def _run(
    tmp_path: Path, body: str, timeout: float = 60
) -> tuple[subprocess.CompletedProcess[str], Path]:
    up = tmp_path / "up"
    up.mkdir()
    (up / "conftest.py").write_text(COUNTING_CONFTEST)
    (up / "test_many.py").write_text(body)
    log = tmp_path / "progress.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "COUNTS_FILE": str(tmp_path / "counts.json"),
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_many.py"]
    argv += ["-p", "ci_relay.execution.progress_plugin", "--progress-log", str(log)]
    argv += ["--per-test-timeout", str(timeout)]
    done = subprocess.run(
        argv,
        cwd=up,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done, log


def _results(log: Path) -> tuple[dict[str, str], ProgressReader]:
    reader = ProgressReader(log)
    results: dict[str, str] = {}
    for events in reader.drain():
        results.update(
            (str(e["nodeid"]), str(e["outcome"])) for e in events if e["event"] == "result"
        )
    return results, reader


def test_a_test_costs_one_write_and_the_watchdog_is_not_armed_per_test(tmp_path: Path) -> None:
    done, log = _run(
        tmp_path,
        "import pytest, time\n"
        "@pytest.mark.parametrize('i', range(300))\n"
        "def test_fast(i):\n    assert i >= 0\n"
        "def test_slow():\n    time.sleep(1.5)\n"  # past the 1 s slack: the next test re-arms
        "@pytest.mark.parametrize('i', range(3))\n"
        "def test_after(i):\n    pass\n",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results, reader = _results(log)
    assert len(results) == 304 and set(results.values()) == {"passed"}
    assert reader.running is None  # the last test's end was written when it finished
    counts = json.loads((tmp_path / "counts.json").read_text())
    # one per test (its start, with the previous test's result and end), and the last one's
    assert counts["writes"] == 304 + 1
    # the first test arms it, the first after the slow one again; 300 fast tests take well
    # under a second each, so a few arms in between at most, never one per test
    assert 2 <= counts["arms"] < 30, counts
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in lines[:4]] == ["start", "result", "end", "start"]
    assert lines[-1] == {"event": "end", "nodeid": "test_many.py::test_after[2]"}


def test_a_process_killed_mid_test_loses_no_finished_result(tmp_path: Path) -> None:
    done, log = _run(
        tmp_path,
        "import os, signal, pytest\n"
        "@pytest.mark.parametrize('i', range(40))\n"
        "def test_ok(i):\n    assert i % 7 != 6\n"  # some fail, with their text
        "def test_dies():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "def test_never():\n    pass\n",
    )
    assert done.returncode == -signal.SIGKILL
    results, reader = _results(log)
    assert len(results) == 40  # every test before the crash: none waited in a buffer
    assert sum(1 for outcome in results.values() if outcome == "failed") == 5
    assert reader.running == "test_many.py::test_dies"  # the crash is charged to it


def test_a_hang_after_fast_tests_is_killed_at_its_timeout(tmp_path: Path) -> None:
    """The watchdog armed by an earlier test still holds the hang to its timeout (less at
    most 1 % of it): the process ends long before the hang would, with the stuck stack."""
    done, log = _run(
        tmp_path,
        "import time, pytest\n"
        "@pytest.mark.parametrize('i', range(50))\n"
        "def test_fast(i):\n    pass\n"
        "def test_hang():\n    time.sleep(600)\n",
        timeout=3,
    )
    assert done.returncode != 0
    results, reader = _results(log)
    assert len(results) == 50
    assert reader.running == "test_many.py::test_hang"
    assert TIMEOUT_MARK in reader.since_start and "test_hang" in reader.since_start


def test_a_hang_right_after_a_failure_is_killed_at_its_timeout(tmp_path: Path) -> None:
    """pytest cancels the watchdog after each failure: a hang that starts within the slack
    of a failing test (unittest runs methods by name, so a failing ``test_fails`` runs
    just before ``test_hang``) is still killed, and so is one in a failed test's teardown."""
    done, log = _run(
        tmp_path,
        "import time, unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_fails(self):\n        self.assertEqual(1, 2)\n"
        "    def test_hang(self):\n        time.sleep(600)\n",
        timeout=3,
    )
    results, reader = _results(log)
    assert results == {"test_many.py::T::test_fails": "failed"}
    assert reader.running == "test_many.py::T::test_hang"
    assert TIMEOUT_MARK in reader.since_start and "test_hang" in reader.since_start
    assert done.returncode != 0
    (tmp_path / "teardown").mkdir()
    done, log = _run(
        tmp_path / "teardown",
        "import time, pytest\n"
        "@pytest.fixture\n"
        "def stuck():\n    yield\n    time.sleep(600)\n"
        "def test_fails_then_hangs(stuck):\n    assert False\n",
        timeout=3,
    )
    _results_after, reader = _results(log)
    assert reader.running == "test_many.py::test_fails_then_hangs"
    assert TIMEOUT_MARK in reader.since_start and "stuck" in reader.since_start


@pytest.mark.parametrize("timeout, slack", [(600.0, 1.0), (5.0, 0.05)])
def test_the_rearm_slack_is_at_most_one_percent_of_the_timeout(
    timeout: float, slack: float, tmp_path: Path
) -> None:
    from ci_relay.execution.progress_plugin import ProgressLog

    log = ProgressLog(str(tmp_path / "p.jsonl"), timeout)
    assert log.slack == pytest.approx(slack)
    os.close(log.fd)
