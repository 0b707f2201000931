"""The relay's coverage maps (issue 34): the nightly's shard records which functions each
test executed, the map is stored per shard, and the next selection of that repository and
backend ranks with it by default, where it finds the one right test inside a large file."""

from __future__ import annotations

import gzip
import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from ci_relay.context import RelayContext
from ci_relay.coverage_maps import forget_cached_maps, newest_map
from ci_relay.nightly import nightly_steps
from ci_relay.policy import PolicyError, load_policy
from ci_relay.store.models import Change, CoverageRecord, Selection
from test_selection.coverage.map import read_streams
from tests.gitrepo import GitRepo
from tests.relay_fixtures import drain, served_app, upstream_context
from tests.test_coverage_map import dispatcher

N = 30  # implementations behind one dispatcher, and tests in the large file
CORE = dispatcher(N)
# the tests read alike: nothing in a test's words says which implementation it reaches
LARGE = (
    "import os\nimport sys\n\n"
    "sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n\n"
    "from pkg.core import dispatch  # noqa: E402\n\n\n"
    + "\n".join(
        f"def test_case_{i:02d}():\n    assert dispatch({i}) == {i} * {i + 2}\n" for i in range(N)
    )
)
SPEC = """\
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_core.py
      unlisted_test_mode: mandatory_success
"""
DAY = datetime(2026, 12, 1, tzinfo=UTC)
FIXED = "test/test_core.py::test_case_17"


def _relay(tmp_path: Path, **extra: object) -> tuple[GitRepo, RelayContext]:
    repo = GitRepo(tmp_path / "upstream")
    repo.commit(
        "base",
        {"pkg/__init__.py": "", "pkg/core.py": CORE, "test/test_core.py": LARGE},
        dedent=False,
    )
    rt = upstream_context(
        tmp_path,
        repo.path,
        SPEC,
        runtime="local",  # the test's own upstream: unisolated by a person's choice
        nightly_at="03:00",
        nightly_repository="sample/pytorch",
        selection_budget="2",
        **extra,
    )
    return repo, rt


def _newest_plan(rt: RelayContext) -> dict[str, object]:
    with rt.db.session() as s:
        change = s.scalars(select(Change).order_by(Change.id.desc())).first()
        assert change is not None
        return dict(
            s.scalars(select(Selection).where(Selection.run_id == change.runs[0].id)).one().plan
        )


def _chosen(plan: dict[str, object]) -> list[str]:
    return [str(t["test"]) for t in plan["selected"]]  # type: ignore[attr-defined, index]


def test_the_nightly_records_a_map_and_the_next_selection_ranks_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo, rt = _relay(tmp_path)
    first = repo.git("rev-parse", "HEAD")
    drain(rt, nightly_steps(rt, DAY.replace(hour=4)))  # the first: the whole universe
    with rt.db.session() as s:
        (row,) = s.scalars(select(CoverageRecord))
        assert (row.repository, row.backend, row.revision, row.tests) == (
            "sample/pytorch",
            "cpu",
            first,
            N,
        )
    cmap = newest_map(rt, "sample/pytorch", "cpu")
    assert cmap is not None and cmap.revision == first
    assert cmap.tests[FIXED][("pkg/core.py", "_impl_17")] == 2  # test -> dispatch -> impl

    # the change fixes one implementation; the next nightly selects 2 of the 30 tests
    repo.commit("unrelated", {"README": "x\n"})
    fix = repo.commit("fix 17", {"pkg/core.py": CORE.replace("n * 19\n", "n * 19 + 0\n")})
    drain(rt, nightly_steps(rt, DAY.replace(hour=4) + timedelta(days=1)))
    plan = _newest_plan(rt)
    assert plan["head"] == fix and plan["base"] == first
    assert _chosen(plan)[0] == FIXED, _chosen(plan)
    coverage = plan["coverage"]
    assert isinstance(coverage, dict)
    assert coverage["revision"] == first and coverage["commits_behind"] == 0
    assert coverage["known_functions"] == ["pkg/core.py:_impl_17"]
    # the run page says which map, how old, what it knew, and why the test was chosen
    with rt.db.session() as s:
        change = s.scalars(select(Change).where(Change.head_sha == fix)).one()
        run_id = change.runs[0].id
    with served_app(rt) as url:
        page = httpx.get(f"{url}/runs/{run_id}", timeout=30).text
    assert f'<dt>coverage map</dt><dd class="coverage-map"><span class="mono">{first[:10]}' in page
    assert "0 commit(s) before the base: knew 1 of 1 changed function(s)" in page
    assert "executed changed pkg/core.py:_impl_17 (2 calls deep" in page
    # too little history for a backtest: the tests it reaches go first, on prior numbers
    assert coverage["used"] == "prior"
    assert "1 test(s) executed one; its tests first in their files (prior numbers" in page
    # this nightly recorded too: now the newest map is its own
    newer = newest_map(rt, "sample/pytorch", "cpu")
    assert newer is not None and newer.revision == fix

    # a damaged row is skipped with a warning; selection goes on without a map
    with rt.db.session() as s:
        for record in s.scalars(select(CoverageRecord)):
            record.data = gzip.compress(b'{"format": "ci-relay-coverage/1", "tests": 3}')
    forget_cached_maps()
    repo.commit("fix 17 again", {"pkg/core.py": CORE.replace("n * 19\n", "n * 19 - 0\n")})
    with caplog.at_level(logging.WARNING, logger="ci_relay.coverage"):
        drain(rt, nightly_steps(rt, DAY.replace(hour=4) + timedelta(days=2)))
    assert "a damaged coverage map" in caplog.text
    plan = _newest_plan(rt)
    assert plan["coverage"] == {} and FIXED not in _chosen(plan)


def test_a_recording_that_is_not_a_map_is_refused_and_the_previous_map_kept(
    tmp_path: Path,
) -> None:
    """A nightly whose tests could not be collected records no map: the shard says so on its
    run page, nothing is stored, and the next selection ranks with the previous nightly's
    map and says which and why."""
    repo, rt = _relay(tmp_path)
    first = repo.git("rev-parse", "HEAD")
    drain(rt, nightly_steps(rt, DAY.replace(hour=4)))
    broken = repo.commit(
        "break collection", {"test/test_core.py": "import no_such_module\n" + LARGE}, dedent=False
    )
    drain(rt, nightly_steps(rt, DAY.replace(hour=4) + timedelta(days=1)))
    with rt.db.session() as s:
        (refused_run,) = s.scalars(select(Change).where(Change.head_sha == broken)).one().runs
        shards = list(refused_run.shards)
        assert shards and all(sh.coverage_note for sh in shards)
        note = shards[0].coverage_note or ""
        assert note.startswith(
            "coverage map not kept: pytest could not collect the tests: test/test_core.py: "
            "ModuleNotFoundError: No module named 'no_such_module'; "
        ), note
        first_run = s.scalars(select(CoverageRecord.run_id)).one()
        assert note.endswith(f"selections keep the map of run {first_run} ({first[:12]})"), note
        assert {r.run_id for r in s.scalars(select(CoverageRecord))} == {first_run}
        refused_id = refused_run.id
    with served_app(rt) as url:
        page = httpx.get(f"{url}/runs/{refused_id}", timeout=30).text
    assert '<div class="shard-coverage">coverage map not kept: pytest could not collect' in page

    fix = repo.commit(
        "fix 17 and collection",
        {"test/test_core.py": LARGE, "pkg/core.py": CORE.replace("n * 19\n", "n * 19 + 0\n")},
        dedent=False,
    )
    drain(rt, nightly_steps(rt, DAY.replace(hour=4) + timedelta(days=2)))
    plan = _newest_plan(rt)
    assert plan["head"] == fix and _chosen(plan)[0] == FIXED, _chosen(plan)
    coverage = plan["coverage"]
    assert isinstance(coverage, dict)
    assert (coverage["revision"], coverage["run"]) == (first, first_run)
    notes = [str(n) for n in plan["notes"]]  # type: ignore[attr-defined]
    assert any(
        n.startswith(f"the newest coverage recording (run {refused_id}, shard 0) was not kept")
        for n in notes
    ), notes
    assert f"ranking with the coverage map of run {first_run} ({first[:12]})" in notes
    with rt.db.session() as s:
        fixed_run = s.scalars(select(Change).where(Change.head_sha == fix)).one().runs[0].id
    with served_app(rt) as url:
        page = httpx.get(f"{url}/runs/{fixed_run}", timeout=30).text
    assert f"ranking with the coverage map of run {first_run} ({first[:12]})" in page
    assert "coverage map recorded: " in page  # this nightly's own recording was kept


def test_without_the_map_the_same_change_misses_the_test(tmp_path: Path) -> None:
    repo, rt = _relay(tmp_path, coverage_select=False)
    drain(rt, nightly_steps(rt, DAY.replace(hour=4)))
    repo.commit("fix 17", {"pkg/core.py": CORE.replace("n * 19\n", "n * 19 + 0\n")})
    drain(rt, nightly_steps(rt, DAY.replace(hour=4) + timedelta(days=1)))
    plan = _newest_plan(rt)
    assert plan["coverage"] == {} and len(_chosen(plan)) == 2
    assert FIXED not in _chosen(plan), _chosen(plan)


def test_runs_record_only_where_the_settings_say(tmp_path: Path) -> None:
    _repo, rt = _relay(tmp_path, coverage_nightly=False)
    drain(rt, nightly_steps(rt, DAY.replace(hour=4)))
    with rt.db.session() as s:
        assert s.scalars(select(CoverageRecord)).first() is None
    _repo, rt = _relay(tmp_path / "b", coverage_nightly=False, coverage_backends=["cpu"])
    drain(rt, nightly_steps(rt, DAY.replace(hour=4)))
    assert newest_map(rt, "sample/pytorch", "cpu") is not None


def test_a_stream_a_test_process_damaged_loses_only_its_bad_lines(tmp_path: Path) -> None:
    stream = tmp_path / "coverage-1.jsonl"
    lines = [
        {"format": "ci-relay-coverage-stream/1", "pid": 7},
        {"pid": 7, "f": [0, "pkg/a.py", "f"]},
        {"pid": 7, "t": "t.py::test_a", "s": [[0, 1]], "flags": []},
        {"pid": 8, "t": "t.py::test_b", "s": [[0, 1]], "flags": []},  # id of another process
        {"pid": 7, "t": "t.py::test_c", "s": [[0, 2]], "flags": ["threads"]},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    stream.write_text(text + "garbage\n" + '{"pid": 7, "t": "t.py::test_d", "s": [[0')
    cmap, skipped = read_streams([stream, tmp_path / "missing.jsonl"], "o/r", "a" * 40, "cpu")
    assert skipped == 3
    assert cmap.tests == {
        "t.py::test_a": {("pkg/a.py", "f"): 1},
        "t.py::test_c": {("pkg/a.py", "f"): 2},
    }
    assert cmap.flags == {"t.py::test_c": {"threads"}}


def test_a_backend_the_policy_sets_to_safe_mode_runs_every_test_the_map_says_was_reached(
    tmp_path: Path,
) -> None:
    repo, rt = _relay(tmp_path, modes={"cpu": "safe"})
    drain(rt, nightly_steps(rt, DAY.replace(hour=4)))  # records the map (everything runs)
    fix = repo.commit("fix 17", {"pkg/core.py": CORE.replace("n * 19\n", "n * 19 + 0\n")})
    drain(rt, nightly_steps(rt, DAY.replace(hour=4) + timedelta(days=1)))
    plan = _newest_plan(rt)
    # no budget (the relay's is 2 tests): the one test that executed the changed function
    assert plan["head"] == fix and plan["mode"] == "safe"
    assert _chosen(plan) == [FIXED] and plan["budget"] == "none (safe mode)"
    notes = plan["notes"]
    assert isinstance(notes, list)
    assert any(str(n).startswith(f"safe mode: 1 of {N} test(s) (3.3%)") for n in notes), notes
    with rt.db.session() as s:
        run_id = s.scalars(select(Change).where(Change.head_sha == fix)).one().runs[0].id
    with served_app(rt) as url:
        page = httpx.get(f"{url}/runs/{run_id}", timeout=30).text
    assert '<dd class="selection-mode">safe: no budget, every test the change reaches' in page
    assert '<dd class="ranking-choice">none: safe mode ranks nothing</dd>' in page
    assert "safe mode: executed a changed function in the coverage map" in page


def test_the_policy_selection_mode_is_validated(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("repositories:\n  a/b:\n    backends:\n      cpu: {selection: safe}\n")
    assert load_policy(good).selection_for("a/b", "cpu") == "safe"
    assert load_policy(good).selection_for("a/b", "spyre-emu") == "ranked"
    assert load_policy(good).selection_for("c/d", "cpu") == "ranked"
    bad = tmp_path / "bad.yaml"
    bad.write_text("repositories:\n  a/b:\n    backends:\n      cpu: {selection: fast}\n")
    with pytest.raises(PolicyError, match="selection") as refused:
        load_policy(bad)
    assert "'ranked' or 'safe'" in str(refused.value)
