"""A running shard hands on each result as its test ends, not when the shard ends.

The upstream's second test waits for a file that only the runner's result callback
creates, after it has seen the first test's result: without streaming, the callback
runs too late and the second test fails on its wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci_relay.execution.runtimes import get_runtime, work_dir
from ci_relay.execution.shard import ProgressTail, ShardRequest, run_shard
from ci_relay.execution.spec_run import TestOutcome

pytestmark = pytest.mark.slow

UPSTREAM_TEST = """
import os
import time
import unittest
from pathlib import Path


class TestStream(unittest.TestCase):
    def test_a_first(self):
        pass

    def test_b_waits_for_the_runner(self):
        go = Path(os.environ["HOME"]) / "go"
        deadline = time.monotonic() + 40
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertTrue(go.exists(), "the runner never saw test_a's result while we ran")
"""
SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_stream.py
      unlisted_test_mode: mandatory_success
"""
A = "test/test_stream.py::TestStream::test_a_first"
B = "test/test_stream.py::TestStream::test_b_waits_for_the_runner"


@pytest.mark.parametrize("runtime_name", ["sandbox", "container"])
def test_results_arrive_while_the_shard_runs(runtime_name: str, tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    (upstream / "test").mkdir(parents=True)
    (upstream / "test" / "test_stream.py").write_text(UPSTREAM_TEST)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    scratch = tmp_path / "s"
    seen: list[list[str]] = []

    def on_results(found: list[TestOutcome]) -> None:
        seen.append([o.nodeid for o in found])
        if any(o.nodeid == A for o in found):
            (work_dir(scratch) / "go").write_text("")

    request = ShardRequest(
        tests=[A, B], specs=[spec], upstream=upstream, scratch=scratch, per_test_timeout=60
    )
    report = run_shard(get_runtime(runtime_name), request, on_results=on_results)
    assert report.results[A].outcome == "passed"
    assert report.results[B].outcome == "passed", report.results[B].details
    assert seen[0] == [A]  # test_a alone: handed on before test_b ended
    assert [n for batch in seen for n in batch].count(A) == 1  # each result once


def test_the_tail_reads_whole_lines_once_and_survives_a_bad_callback(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    batches: list[list[str]] = []
    tail = ProgressTail(log, lambda found: batches.append([o.outcome for o in found]))
    tail.poll()  # no file yet: nothing, no error
    first = {"event": "result", "nodeid": "t::a", "outcome": "passed", "mode": None}
    second = {"event": "result", "nodeid": "t::b", "outcome": "failed", "message": "boom"}
    line_b = json.dumps(second)
    log.write_text(json.dumps({"event": "start", "nodeid": "t::a"}) + "\n")
    with log.open("a") as out:
        out.write(json.dumps(first) + "\n" + line_b[:10])  # the child is mid-line
    tail.poll()
    with log.open("a") as out:
        out.write(line_b[10:] + "\nnot json\n")
    tail.poll()
    tail.poll()  # nothing new
    assert batches == [["passed"], ["failed"]]

    def broken(_found: list[TestOutcome]) -> None:
        raise RuntimeError("database is down")

    with log.open("a") as out:
        out.write(json.dumps(first) + "\n")
    failing = ProgressTail(log, broken)
    failing.poll()  # logged, not raised: the shard's final report still stores everything


def test_the_tail_never_reads_through_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"event": "result", "nodeid": "x", "outcome": "passed"}) + "\n")
    log = tmp_path / "progress.jsonl"
    log.symlink_to(secret)
    batches: list[object] = []
    ProgressTail(log, batches.append).poll()
    assert batches == []


def test_lines_the_test_code_forged_are_dropped_not_trusted(tmp_path: Path) -> None:
    """The test shares the child's process and may write into the log: a result without a
    node id, a list, or a bad duration must not stop the tail (or the shard runner)."""
    log = tmp_path / "progress.jsonl"
    forged = [
        {"event": "result", "outcome": "passed"},
        ["not", "an", "event"],
        {"event": "result", "nodeid": 5, "outcome": "passed"},
        {"event": "explode", "nodeid": "t::x"},
        {"event": "result", "nodeid": "t::c", "outcome": "passed", "duration": "abc"},
    ]
    log.write_text("".join(json.dumps(f) + "\n" for f in forged))
    seen: list[TestOutcome] = []
    ProgressTail(log, seen.extend).poll()
    assert [(o.nodeid, o.duration) for o in seen] == [("t::c", 0.0)]
