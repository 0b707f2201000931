"""A running shard hands on each result as its test ends, not when the shard ends, and keeps
none of them itself.

The upstream's second test waits for a file that only the runner's result callback
creates, after it has seen the first test's result: without streaming, the callback
runs too late and the second test fails on its wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci_relay.execution import shard
from ci_relay.execution.crashes import ProgressReader
from ci_relay.execution.runtimes import get_runtime, work_dir
from ci_relay.execution.shard import ResultsHandedOn, ShardRequest, run_shard
from ci_relay.execution.spec_run import TestOutcome

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


@pytest.mark.slow
@pytest.mark.parametrize("runtime_name", ["sandbox", "container"])
def test_results_arrive_while_the_shard_runs(runtime_name: str, tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    (upstream / "test").mkdir(parents=True)
    (upstream / "test" / "test_stream.py").write_text(UPSTREAM_TEST)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    scratch = tmp_path / "s"
    seen: list[list[str]] = []
    stored: dict[str, TestOutcome] = {}

    def on_results(found: list[TestOutcome]) -> None:
        seen.append([o.nodeid for o in found])
        stored.update((o.nodeid, o) for o in found)
        if any(o.nodeid == A for o in found):
            (work_dir(scratch) / "go").write_text("")

    request = ShardRequest(
        tests=[A, B], specs=[spec], upstream=upstream, scratch=scratch, per_test_timeout=60
    )
    report = run_shard(get_runtime(runtime_name), request, on_results=on_results)
    assert stored[A].outcome == "passed"
    assert stored[B].outcome == "passed", stored[B].details
    assert report.results == {}  # streamed: the runner holds none of them
    assert report.counts == {"passed": 2} and report.error is None
    assert seen[0] == [A]  # test_a alone: handed on before test_b ended
    assert [n for batch in seen for n in batch].count(A) == 1  # each result once


def _results(events: list[dict[str, object]]) -> list[tuple[str, str]]:
    return [(str(e["nodeid"]), str(e["outcome"])) for e in events if e["event"] == "result"]


def test_the_reader_takes_whole_lines_once_and_keeps_the_last_tests_text(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    reader = ProgressReader(log)
    assert reader.read() == []  # no file yet: nothing, no error
    first = {"event": "result", "nodeid": "t::a", "outcome": "passed", "mode": None}
    second = {"event": "result", "nodeid": "t::b", "outcome": "failed", "message": "boom"}
    line_b = json.dumps(second)
    log.write_text(json.dumps({"event": "start", "nodeid": "t::a"}) + "\n")
    with log.open("a") as out:
        out.write(json.dumps(first) + "\n" + line_b[:10])  # the child is mid-line
    assert _results(reader.read()) == [("t::a", "passed")]
    with log.open("a") as out:
        out.write(line_b[10:] + "\nnot json\n")
    assert _results(reader.read()) == [("t::b", "failed")]
    assert reader.read() == []  # nothing new
    assert reader.running == "t::a"  # started, never ended
    with log.open("a") as out:
        out.write(json.dumps({"event": "start", "nodeid": "t::c"}) + "\nFatal Python error: Segm")
    assert [e["event"] for batch in reader.drain() for e in batch] == ["start"]
    assert reader.running == "t::c"
    # what followed t::c's start, its last line cut by the crash: a crash record quotes it
    assert reader.since_start.splitlines()[1:] == ["Fatal Python error: Segm"]
    assert reader.events == 4


def test_a_batch_the_store_refused_is_retried_and_never_dropped() -> None:
    stored: list[str] = []
    down = True

    def store(found: list[TestOutcome]) -> None:
        if down:
            raise RuntimeError("database is down")
        stored.extend(o.nodeid for o in found)

    results = ResultsHandedOn(store, keep_failures=20)
    results.add([TestOutcome("t::a", "passed", None, 0.1)])  # logged, kept for the next try
    with pytest.raises(RuntimeError, match="database is down"):
        results.flush()  # at the shard's end, still down: the shard fails, loudly
    down = False
    results.add([TestOutcome("t::b", "failed", None, 0.1, "boom")])
    assert stored == ["t::a", "t::b"]
    results.flush()  # nothing left
    assert stored == ["t::a", "t::b"]
    assert results.must_pass_failures == 1 and list(results.failures) == ["t::b"]
    results.add([TestOutcome("t::b", "passed", None, 0.1, flaky=True)])  # a rerun's verdict
    assert results.counts == {"passed": 1, "flaky": 1} and results.must_pass_failures == 0


def test_the_reader_never_reads_through_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"event": "result", "nodeid": "x", "outcome": "passed"}) + "\n")
    log = tmp_path / "progress.jsonl"
    log.symlink_to(secret)
    reader = ProgressReader(log)
    assert reader.read() == [] and list(reader.drain()) == []


def test_lines_the_test_code_forged_are_dropped_not_trusted(tmp_path: Path) -> None:
    """The test shares the child's process and may write into the log: a result without a
    node id, a list, or an unknown event must not stop the reader (or the shard runner)."""
    log = tmp_path / "progress.jsonl"
    forged = [
        {"event": "result", "outcome": "passed"},
        ["not", "an", "event"],
        {"event": "result", "nodeid": 5, "outcome": "passed"},
        {"event": "explode", "nodeid": "t::x"},
        {"event": "result", "nodeid": "t::y", "outcome": 3},
        {"event": "result", "nodeid": "t::c", "outcome": "passed", "duration": "abc"},
    ]
    log.write_text("".join(json.dumps(f) + "\n" for f in forged))
    events = ProgressReader(log).read()
    assert _results(events) == [("t::c", "passed")]
    (result,) = [shard._outcome_of(e) for e in events if e["event"] == "result"]
    assert result.duration == 0.0  # a duration that is not a number counts as none
