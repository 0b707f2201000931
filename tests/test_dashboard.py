"""Dashboard pages and their JSON API on real SQLite and PostgreSQL databases.

Rows are written through the models (what the pipeline stores); the browser test
(``test_dashboard_browser.py``) covers a real pipeline run end to end.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from sqlalchemy import event, insert
from sqlalchemy.orm import Session

from ci_relay.dashboard.charts import Series, line_chart, nice_ceiling
from ci_relay.dashboard.selection import explain, match_variants
from ci_relay.dashboard.status import ordered_counts, pass_rate, run_status
from ci_relay.store.models import (
    Change,
    Delivery,
    Run,
    Selection,
    Shard,
    TestResult,
    Triage,
)
from tests.relay_fixtures import Relay

T0 = datetime(2026, 10, 1, 12, 0, tzinfo=UTC)
EVIL = "<script>alert('x')</script>"
EVIL_NODEID = f"test/test_evil.py::TestEvil::test_{EVIL}"
EVIL_BACKEND = "<script>x"  # backend names are at most 32 characters


def sha(n: int) -> str:
    return f"{n:040x}"


def evidence(stage: str, source: str, score: float, reason: str) -> dict[str, Any]:
    return {"stage": stage, "source": source, "score": score, "reason": reason}


def planned(
    test: str, score: float, evidence_items: list[dict[str, Any]], shard: int | None
) -> dict[str, Any]:
    return {
        "test": test,
        "file": test.split("::")[0],
        "score": score,
        "reasons": [e["reason"] for e in evidence_items if e["score"] > 0],
        "evidence": evidence_items,
        "duration": 1.5,
        "shard": shard,
        "mode": "mandatory_success",
    }


PLAN = {
    "base": sha(1),
    "head": sha(2),
    "budget": "15%",
    "agent": "local",
    "universe_size": 40,
    "selected": [
        planned(
            "test/test_binary_ufuncs.py::TestBinaryUfuncs::test_floor_divide",
            2.5,
            [
                evidence("candidates", "edited-by-change", 1.0, "the change adds this test"),
                evidence("candidates", "references-change", 0.9, "uses changed op floor_divide"),
                evidence("agent", "local", 0.4, "similar to the change in torch/_refs (cos 0.72)"),
                evidence("plan", "budget", 0.0, "within the 15% budget"),
            ],
            0,
        ),
        planned(
            "test/test_binary_ufuncs.py::TestBinaryUfuncs::test_floor_divide_scalar",
            1.2,
            [evidence("candidates", "path-keywords", 0.4, "its file name matches binary")],
            0,
        ),
        planned(
            EVIL_NODEID,
            0.5,
            [evidence("candidates", "path-keywords", 0.5, f"reason with {EVIL}")],
            0,
        ),
    ],
    "excluded": [
        planned(
            f"test/test_view_ops.py::TestViewOps::test_view_{i}",
            0.1 - i / 1000,
            [evidence("candidates", "co-change", 0.1, "its file changed with these sources")],
            None,
        )
        for i in range(130)
    ],
    "shards": [["..."]],
    "change": {
        "files": [{"path": "torch/_refs/__init__.py", "status": "M", "binary": False}],
        "file_count": 1,
        "symbols": ["torch/_refs/__init__.py:floor_divide"],
        "tests_added": ["test/test_binary_ufuncs.py::TestBinaryUfuncs::test_floor_divide"],
        "tests_modified": [],
        "tests_removed": [],
        "ops": ["floor_divide"],
    },
    "notes": ["compared 40 tests with 1 changed file(s)"],
}


@dataclass
class Store:
    """Writes the rows the pipeline would, with readable defaults."""

    session: Session
    deliveries: int = 0
    ids: dict[str, int] = field(default_factory=dict)

    def change(
        self,
        head: str,
        *,
        number: int | None = 7,
        repository: str = "sample/pytorch",
        title: str = "Add floor_divide",
        at: datetime = T0,
        kind: str = "pull_request",
    ) -> Change:
        self.deliveries += 1
        body = (
            f'{{"pull_request": {{"title": {_json(title)}}}}}'
            if kind == "pull_request"
            else f'{{"head_commit": {{"message": {_json(title)}}}}}'
        )
        delivery = Delivery(
            source="github",
            hook_id="1",
            delivery_id=f"delivery-{self.deliveries}",
            event=kind if kind != "rerun" else "check_run",
            action="synchronize",
            repository=repository,
            head_sha=head,
            state="processed",
            body=body.encode(),
            received_at=at,
        )
        change = Change(
            delivery=delivery,
            repository=repository,
            kind=kind,
            number=number,
            ref="pr-7",
            base_sha=sha(1),
            head_sha=head,
            created_at=at,
        )
        self.session.add(change)
        self.session.flush()
        return change

    def run(
        self,
        change: Change,
        backend: str = "cpu",
        *,
        attempt: int = 1,
        state: str = "completed",
        conclusion: str | None = "success",
        results: Sequence[tuple[str, str, str | None]] = (),
        plan: dict[str, Any] | None = None,
        log_tail: str | None = None,
        first_result_after: float = 30.0,
    ) -> Run:
        counts: dict[str, int] = {}
        for _, outcome, _ in results:
            counts[outcome] = counts.get(outcome, 0) + 1
        run = Run(
            change=change,
            backend=backend,
            attempt=attempt,
            level="L2",
            state=state,
            conclusion=conclusion,
            counts=counts if state == "completed" else {},
            created_at=change.created_at,
            started_at=change.created_at,
            finished_at=change.created_at + timedelta(seconds=60) if state == "completed" else None,
        )
        self.session.add(run)
        if plan is not None:
            self.session.add(Selection(run=run, strategy="four-stage/local", plan=plan))
        if results or state == "completed":
            shard = Shard(
                run=run,
                index=0,
                test_files=[t["test"] for t in plan["selected"]]
                if plan
                else [n for n, _, _ in results],
                state="done",
                attempts=1,
                exit_code=1 if conclusion == "failure" else 0,
                log_tail=log_tail,
                started_at=change.created_at,
                finished_at=change.created_at + timedelta(seconds=first_result_after),
            )
            self.session.add(shard)
            for nodeid, outcome, message in results:
                self.session.add(
                    TestResult(
                        shard=shard,
                        nodeid=nodeid,
                        outcome=outcome,
                        mode="mandatory_success",
                        duration=0.25 if outcome != "flaky" else 0.75,
                        message=message,
                    )
                )
        self.session.flush()
        return run


def _json(text: str) -> str:
    return json.dumps(text)


@pytest.fixture
def store(relay: Relay) -> Iterator[Store]:
    with relay.rt.db.session() as session:
        yield Store(session)


def page(relay: Relay, url: str, status: int = 200) -> str:
    response = relay.client.get(url)
    assert response.status_code == status, response.text[:500]
    if status == 200 and not url.startswith("/api/"):
        assert response.headers["content-type"].startswith("text/html")
    return response.text


def text_of(markup: str) -> str:
    """Visible text, roughly: tags dropped, entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


# --- pure helpers --------------------------------------------------------------------------


def test_run_status_covers_every_state() -> None:
    assert run_status("completed", "success") == "success"
    assert run_status("completed", "failure") == "failure"
    assert run_status("completed", "error") == "error"
    assert run_status("completed", "neutral") == "neutral"
    assert run_status("failed", None) == "error"
    assert run_status("selecting", None) == run_status("running", None) == "running"
    assert run_status("pending", None) == "pending"


def test_counts_read_failures_first_and_pass_rate_ignores_skips() -> None:
    assert list(ordered_counts({"passed": 3, "skipped": 1, "failed": 2, "zero": 0})) == [
        "failed",
        "passed",
        "skipped",
    ]
    assert pass_rate({"passed": 3, "failed": 1, "skipped": 10}) == 0.75
    assert pass_rate({"passed": 1, "flaky": 1}) == 1.0
    assert pass_rate({"skipped": 2}) is None


def test_variants_match_the_most_specific_generic_test() -> None:
    generic = [
        "test/test_b.py::TestB::test_add",
        "test/test_b.py::TestB::test_add_scalar",
        "test/test_v.py::TestPlain::test_flat",
    ]
    executed = [
        "test/test_b.py::TestBCPU::test_add_cpu_float32",
        "test/test_b.py::TestBCPU::test_add_scalar_cpu",
        "test/test_b.py::TestBSPYRE::test_add_spyre_float16",
        "test/test_v.py::TestPlain::test_flat",
        "test/test_v.py::TestOther::test_flat",  # another class: not a variant
        "test/test_x.py::TestB::test_add_cpu",  # another file: not a variant
    ]
    assert match_variants(generic, executed) == {
        "test/test_b.py::TestB::test_add": [
            "test/test_b.py::TestBCPU::test_add_cpu_float32",
            "test/test_b.py::TestBSPYRE::test_add_spyre_float16",
        ],
        "test/test_b.py::TestB::test_add_scalar": ["test/test_b.py::TestBCPU::test_add_scalar_cpu"],
        "test/test_v.py::TestPlain::test_flat": ["test/test_v.py::TestPlain::test_flat"],
    }


def test_explain_groups_evidence_by_stage_and_pages_the_left_out() -> None:
    view = explain("four-stage/local", PLAN, {}, selected_page=1, excluded_page=2, per_page=100)
    first = view.selected[0]
    assert [s.stage for s in first.stages] == ["candidates", "agent", "plan"]
    assert first.stages[0].score == pytest.approx(1.9)
    assert [i.source for i in first.stages[0].items] == ["edited-by-change", "references-change"]
    assert (view.selected_total, view.excluded_total, view.universe_size) == (3, 130, 40)
    assert len(view.excluded) == 30 and view.excluded_pager.page == 2
    assert view.excluded[0].test.endswith("test_view_100")


def test_explain_survives_a_sparse_or_older_plan() -> None:
    view = explain("legacy", {"selected": [{"test": "t.py::test_a"}, "junk"]}, {})
    assert view.selected_total == 1 and view.selected[0].stages == []
    assert view.universe_size == 0 and view.change == {}


def test_charts_scale_to_a_readable_top_and_break_lines_at_gaps() -> None:
    assert [nice_ceiling(v) for v in (0, 0.7, 3, 12, 450, 1000)] == [1, 1, 5, 20, 500, 1000]
    chart = line_chart(
        "c",
        [Series("s", "line", [1.0, None, 3.0, 4.0], ["a", "b", "c", "d"])],
        ["1", "2", "3", "4"],
    )
    (line,) = chart.lines
    assert len(line.segments) == 2 and len(line.points) == 3
    top, bottom = chart.plot_top, chart.plot_bottom
    assert line.points[-1].y == pytest.approx(top + (bottom - top) * (1 - 4 / 5), abs=0.1)
    assert line_chart("e", [Series("s", "line", [None], [""])], ["1"]).empty


# --- pages on both databases ----------------------------------------------------------------


def test_empty_grid_says_how_to_fill_it(relay: Relay) -> None:
    body = page(relay, "/")
    assert "No upstream change has been received yet" in body
    data = relay.client.get("/api/grid").json()
    assert data["rows"] == [] and data["backends"] == [] and data["pager"]["total"] == 0


def test_grid_shows_latest_run_per_backend_newest_commit_first(relay: Relay, store: Store) -> None:
    old = store.change(sha(10), at=T0)
    store.run(old, "cpu", results=[("t.py::test_a", "passed", None)])
    new = store.change(sha(11), at=T0 + timedelta(hours=1))
    store.run(
        new,
        "cpu",
        conclusion="failure",
        results=[("t.py::test_a", "failed", "boom"), ("t.py::test_b", "passed", None)],
    )
    store.run(
        new, "spyre", state="running", conclusion=None, results=[("t.py::test_a", "passed", None)]
    )
    rerun = store.run(
        new, "cpu", attempt=2, conclusion="success", results=[("t.py::test_a", "passed", None)]
    )
    pending = store.change(sha(12), at=T0 + timedelta(hours=2), number=None, kind="push")
    store.run(pending, "spyre", state="pending", conclusion=None)
    store.session.commit()

    data = relay.client.get("/api/grid").json()
    assert [r["head_sha"] for r in data["rows"]] == [sha(12), sha(11), sha(10)]
    assert data["backends"] == ["cpu", "spyre"]
    cells = data["rows"][1]["cells"]
    assert cells["cpu"]["run_id"] == rerun.id and cells["cpu"]["runs"] == 2
    assert cells["cpu"]["status"] == "success"
    assert cells["spyre"]["status"] == "running" and cells["spyre"]["counts"] == {"passed": 1}
    assert data["rows"][0]["cells"]["spyre"]["status"] == "pending"
    assert data["rows"][0]["number"] is None and data["rows"][1]["number"] == 7

    body = page(relay, "/")
    assert f'href="/runs/{rerun.id}"' in body
    assert f'href="/commits/{sha(11)}"' in body
    assert 'class="cell status-running"' in body and 'class="cell status-pending"' in body
    assert 'data-backend="cpu" data-status="success"' in body


def test_grid_pages(relay: Relay, store: Store) -> None:
    for n in range(5):
        store.run(store.change(sha(100 + n), at=T0 + timedelta(minutes=n)), "cpu")
    store.session.commit()
    first = relay.client.get("/api/grid", params={"per_page": 2}).json()
    last = relay.client.get("/api/grid", params={"per_page": 2, "page": 3}).json()
    beyond = relay.client.get("/api/grid", params={"per_page": 2, "page": 99}).json()
    assert [r["head_sha"] for r in first["rows"]] == [sha(104), sha(103)]
    assert [r["head_sha"] for r in last["rows"]] == [sha(100)]
    assert beyond["pager"]["page"] == 3
    assert first["pager"]["pages"] == 3 and first["pager"]["has_next"]
    body = page(relay, "/?per_page=2&page=2")
    assert 'href="/?per_page=2&amp;page=3"' in body and 'href="/?per_page=2&amp;page=1"' in body
    assert relay.client.get("/api/grid", params={"per_page": 0}).status_code == 422


def test_commit_page_lists_every_run_shard_and_failure(relay: Relay, store: Store) -> None:
    change = store.change(sha(20), title="Fix floor_divide rounding")
    failing = store.run(
        change,
        "cpu",
        conclusion="failure",
        results=[
            (
                "test/t.py::TestTCPU::test_floor_cpu",
                "failed",
                "AssertionError: Tensor-likes are not equal!",
            ),
            ("test/t.py::TestTCPU::test_sometimes_cpu", "flaky", "passed on rerun"),
            ("test/t.py::TestTCPU::test_ok_cpu", "passed", None),
        ],
        log_tail="runtime local\nFAILED test/t.py::TestTCPU::test_floor_cpu\nTraceback: line 12\n",
    )
    store.run(change, "spyre", results=[("test/t.py::TestTSPYRE::test_ok_spyre", "passed", None)])
    store.session.execute(
        insert(Triage).values(
            run_id=failing.id,
            state="done",
            verdict={
                "category": "upstream",
                "confidence": "high",
                "summary": "floor_divide expectation is wrong upstream",
            },
            tests=[],
            device_seconds=1.5,
        )
    )
    store.session.commit()

    for url in (f"/commits/{sha(20)}", f"/commits/{sha(20)[:12]}"):
        text = text_of(page(relay, url))
        assert "Fix floor_divide rounding" in text
        assert f"run {failing.id} · cpu" in text and "spyre" in text
        assert "AssertionError: Tensor-likes are not equal!" in text
        assert "FAILED test/t.py::TestTCPU::test_floor_cpu" in text  # the log lines of the failure
        assert "flaky" in text and "passed on rerun" in text
        assert "triage : upstream (high confidence)" in text
        assert "floor_divide expectation is wrong upstream" in text
        assert "Traceback: line 12" in text  # the shard's log tail
    body = page(relay, f"/commits/{sha(20)}")
    data = relay.client.get(f"/api/commits/{sha(20)}").json()
    (head,) = data["heads"]
    run = next(r for r in head["runs"] if r["id"] == failing.id)
    failure_ids = [f["result_id"] for f in run["failures"]]
    assert [f["outcome"] for f in run["failures"]] == ["failed", "flaky"]  # broken first
    assert run["failures_total"] == 2 and run["failures"][1]["flaky"] is True
    for result_id in failure_ids:
        assert f'id="failure-{result_id}"' in body
        assert f'href="/runs/{failing.id}#failure-{result_id}"' in body
    assert 'href="/tests?nodeid=test%2Ft.py%3A%3ATestTCPU%3A%3Atest_floor_cpu"' in body


def test_pull_request_page_shows_each_head_newest_first(relay: Relay, store: Store) -> None:
    first = store.change(sha(30), title="first title", at=T0)
    store.run(first, "cpu")
    second = store.change(sha(31), title="renamed title", at=T0 + timedelta(hours=1))
    store.run(second, "cpu", conclusion="failure", results=[("t.py::test_x", "failed", "bad")])
    store.run(store.change(sha(32), number=8), "cpu")
    other_repo = store.change(sha(33), repository="other/repo")
    store.run(other_repo, "cpu")
    store.session.commit()

    data = relay.client.get("/api/prs/7", params={"repo": "sample/pytorch"}).json()
    assert data["title"] == "renamed title"
    assert [h["head_sha"] for h in data["heads"]] == [sha(31), sha(30)]
    assert len(relay.client.get("/api/prs/7").json()["heads"]) == 3
    text = text_of(page(relay, "/prs/7?repo=sample/pytorch"))
    assert "Pull request #7" in text and "renamed title" in text and "bad" in text


def test_run_page_explains_the_selection(relay: Relay, store: Store) -> None:
    change = store.change(sha(40))
    run = store.run(
        change,
        "cpu",
        conclusion="failure",
        plan=PLAN,
        results=[
            (
                "test/test_binary_ufuncs.py::TestBinaryUfuncsCPU::test_floor_divide_cpu_int64",
                "failed",
                "wrong",
            ),
            (
                "test/test_binary_ufuncs.py::TestBinaryUfuncsCPU::test_floor_divide_scalar_cpu",
                "passed",
                None,
            ),
        ],
    )
    store.session.commit()

    body = page(relay, f"/runs/{run.id}")
    text = text_of(body)
    assert "2 of 40 tests" not in text and "3 of 40 tests in the specs' universe" in text
    for expected in (
        "the change adds this test",
        "edited-by-change +1.00",
        "references-change +0.90 uses changed op floor_divide",
        "agent +0.40",
        "similar to the change in torch/_refs (cos 0.72)",
        "plan +0.00",
        "within the 15% budget",
        "compared 40 tests with 1 changed file(s)",
        "torch/_refs/__init__.py:floor_divide",
        "Left out (130)",
        "test/test_view_ops.py::TestViewOps::test_view_0",
    ):
        assert expected in text, expected
    assert "test_view_100" not in text  # the second page of the left-out tests
    assert "test_view_100" in text_of(page(relay, f"/runs/{run.id}?excluded_page=2"))
    assert f'href="/runs/{run.id}?selected_page=1&amp;excluded_page=2"' in body

    data = relay.client.get(f"/api/runs/{run.id}/view").json()
    selected = {t["test"]: t for t in data["selection"]["selected"]}
    floor = selected["test/test_binary_ufuncs.py::TestBinaryUfuncs::test_floor_divide"]
    assert floor["variants"] == [
        {
            "nodeid": "test/test_binary_ufuncs.py::TestBinaryUfuncsCPU::test_floor_divide_cpu_int64",
            "outcome": "failed",
        }
    ]
    scalar = selected["test/test_binary_ufuncs.py::TestBinaryUfuncs::test_floor_divide_scalar"]
    assert [v["outcome"] for v in scalar["variants"]] == ["passed"]
    assert [s["stage"] for s in floor["stages"]] == ["candidates", "agent", "plan"]
    # the relay's raw run is still there, next to the page's data
    assert relay.client.get(f"/api/runs/{run.id}").json()["selection"]["universe_size"] == 40


def test_run_page_says_which_ranking_the_backtest_chose(relay: Relay, store: Store) -> None:
    ranking = {
        "chosen": "learned",
        "description": "learned model",
        "reason": "chosen by backtest on 60 past commit(s) up to abc at 15% of the tests",
        "backtest_commits": 60,
        "anchor": sha(3),
        "budget_fraction": 0.15,
        "candidates": [
            {
                "ranking": "history",
                "description": "history counting + path words",
                "file_recall": 0.72,
                "edited_test_recall": 0.61,
            },
            {
                "ranking": "learned",
                "description": "learned model",
                "file_recall": 0.84,
                "edited_test_recall": 0.7,
            },
            {  # the same ranking with a coverage map: chosen, the one above is not
                "ranking": "learned",
                "coverage": "reached-first",
                "description": "learned model, tests the coverage map reaches first",
                "file_recall": 0.84,
                "edited_test_recall": 0.8,
            },
            {  # found more, but on trial: shown, never chosen
                "ranking": "blend",
                "allocation": "model",
                "description": "history and learned model, tests by the test model",
                "file_recall": 0.9,
                "edited_test_recall": 0.9,
                "trial": True,
            },
        ],
        "coverage": "reached-first",
    }
    selected = [
        planned(
            "test/test_a.py::TestA::test_x",
            0.0042,
            [
                evidence(
                    "candidates", "ranking", 0.0042, "test/test_a.py is #1 of 9 by learned model"
                )
            ],
            0,
        )
    ]
    run = store.run(
        store.change(sha(42)),
        "cpu",
        plan={**PLAN, "selected": selected, "ranking": ranking},
    )
    store.session.commit()
    text = text_of(page(relay, f"/runs/{run.id}"))
    for expected in (
        "ranking learned model (chosen by backtest on 60 past commits)",
        "history counting + path words 72.0% 61.0%",
        "learned model 84.0% 70.0% learned model, tests the coverage map reaches first 84.0% "
        "80.0% chosen",
        "history and learned model, tests by the test model 90.0% 90.0% on trial: never chosen",
        "ranking +0.0042 test/test_a.py is #1 of 9 by learned model",
    ):
        assert expected in text, (expected, text[:3000])
    # a plan from before the backtest (or with too little history) says hand weights
    old = store.run(store.change(sha(43)), "cpu", plan=PLAN)
    store.session.commit()
    assert "ranking hand weights" in text_of(page(relay, f"/runs/{old.id}"))


def test_run_page_shows_the_coverage_floor_and_the_executing_tests_it_took(
    relay: Relay, store: Store
) -> None:
    coverage = {
        "revision": sha(7),
        "used": "unused",
        "recorded_at": "2026-12-01T02:00:00+00:00",
        "commits_behind": 4,
        "changed_functions": 3,
        "known_functions": ["pkg/a.py:f", "pkg/a.py:g"],
        "tests_reached": 9,
        "floor": {
            "tests": ["t/test_a.py::test_f", "t/test_a.py::test_g"],
            "executed": 7,
            "executed_taken": 3,
            "reached": ["pkg/a.py:f", "pkg/a.py:g"],
            "unreached": [],
            "unknown": ["pkg/b.py:new"],
            "skipped": "",
        },
    }
    run = store.run(store.change(sha(44)), "cpu", plan={**PLAN, "coverage": coverage})
    store.session.commit()
    text = text_of(page(relay, f"/runs/{run.id}"))
    for expected in (
        "not used to rank: the backtest found no gain (the floor still uses it)",
        "coverage floor 2 test(s) reach 2 changed function(s), each by its most specific test, "
        "then 3 more that executed one; not reached: pkg/b.py:new",
    ):
        assert expected in text, (expected, text[:3000])
    # a plan whose floor took nothing past the most specific tests says nothing more
    coverage["floor"] = {**coverage["floor"], "executed_taken": 0}
    plain = store.run(store.change(sha(45)), "cpu", plan={**PLAN, "coverage": coverage})
    store.session.commit()
    assert "more that executed one" not in text_of(page(relay, f"/runs/{plain.id}"))


def test_run_page_before_selection(relay: Relay, store: Store) -> None:
    run = store.run(store.change(sha(41)), "cpu", state="pending", conclusion=None)
    store.session.commit()
    text = text_of(page(relay, f"/runs/{run.id}"))
    assert "pending" in text and "No selection stored yet" in text


def test_test_page_shows_history_flake_rate_and_durations(relay: Relay, store: Store) -> None:
    nodeid = "test/t.py::TestTCPU::test_wobbly_cpu"
    outcomes = ["passed", "flaky", "failed", "passed"]
    for i, outcome in enumerate(outcomes):
        change = store.change(sha(50 + i), at=T0 + timedelta(hours=i), number=None, kind="push")
        store.run(change, "cpu", results=[(nodeid, outcome, f"message {i}")])
    store.session.commit()

    data = relay.client.get("/api/tests", params={"nodeid": nodeid}).json()
    assert (data["total"], data["passed"], data["failed"], data["flaky"]) == (4, 2, 1, 1)
    assert data["flake_rate"] == 0.25 and data["failure_rate"] == 0.25
    assert [e["head_sha"] for e in data["entries"]] == [sha(53), sha(52), sha(51), sha(50)]
    assert [d[2] for d in data["durations"]] == outcomes  # oldest first
    assert data["max_duration"] == 0.75
    body = page(relay, f"/tests?nodeid={nodeid}")
    assert "25.0%" in text_of(body) and "<svg" in body and body.count('class="point ') == 4
    assert f'href="/commits/{sha(52)}"' in body


def test_trends_chart_pass_rate_selection_and_time_to_signal(relay: Relay, store: Store) -> None:
    a = store.run(
        store.change(sha(60), at=T0),
        "cpu",
        plan=PLAN,
        results=[("t.py::test_a", "passed", None), ("t.py::test_b", "failed", "x")],
        conclusion="failure",
        first_result_after=42.0,
    )
    store.run(
        store.change(sha(61), at=T0 + timedelta(hours=1)),
        "spyre",
        plan=PLAN,
        results=[("t.py::test_a", "passed", None)],
    )
    store.run(
        store.change(sha(62)), "cpu", state="running", conclusion=None
    )  # unfinished: no point
    store.session.commit()

    data = relay.client.get("/api/trends").json()
    assert data["backends"] == ["cpu", "spyre"]
    first = data["points"][0]
    assert first["run_id"] == a.id and first["pass_rate"] == 0.5
    assert (first["selected"], first["universe"]) == (3, 40)
    assert first["time_to_signal"] == pytest.approx(42.0)
    assert len(data["points"]) == 2 and data["mean_pass_rate"] == 0.75
    only_cpu = relay.client.get("/api/trends", params={"backend": "cpu"}).json()
    assert [p["backend"] for p in only_cpu["points"]] == ["cpu"]
    body = page(relay, "/trends")
    assert body.count("<svg") == 3 and "<polyline" in body
    assert "Time to signal" in body and "42.0 s" in text_of(body)
    assert '<option value="spyre"' in body


def test_unknown_ids_answer_404_with_a_clear_message(relay: Relay) -> None:
    for url, message in (
        ("/runs/999", "There is no run 999."),
        (f"/commits/{sha(999)}", f"No change for commit {sha(999)} has been received."),
        ("/prs/12345", "No change for pull request #12345 has been received."),
        (
            "/tests?nodeid=test/none.py::test_none",
            "No result has been stored for the test test/none.py::test_none.",
        ),
    ):
        assert message in text_of(page(relay, url, 404))
    for url, detail in (
        ("/api/runs/999/view", "no run 999"),
        (f"/api/commits/{sha(999)}", f"no change for commit {sha(999)} has been received"),
        ("/api/prs/12345", "no change for pull request #12345 has been received"),
        ("/api/tests?nodeid=nope", "no result has been stored for the test nope"),
    ):
        response = relay.client.get(url)
        assert response.status_code == 404 and response.json() == {"detail": detail}
    body = page(relay, "/commits/<img src=x onerror=alert(1)>", 404)
    assert "<img" not in body and "No change for commit &lt;img src=x onerror=alert(1)&gt;" in body


def test_markup_in_stored_data_is_escaped_on_every_page(relay: Relay, store: Store) -> None:
    change = store.change(sha(70), title=f"title {EVIL}")
    run = store.run(
        change,
        EVIL_BACKEND,
        conclusion="failure",
        plan=PLAN,
        results=[(EVIL_NODEID, "failed", f"message {EVIL}")],
        log_tail=f"FAILED {EVIL_NODEID}\n{EVIL}",
    )
    store.session.commit()
    urls = [
        "/",
        f"/commits/{sha(70)}",
        "/prs/7",
        f"/runs/{run.id}",
        "/trends",
        f"/trends?backend={EVIL_BACKEND}",
    ]
    urls.append("/tests?" + urlencode({"nodeid": EVIL_NODEID}))
    own = '<script>\ndocument.getElementById("rerun")'  # the run page's rerun button
    for url in urls:
        body = page(relay, url)
        assert body.count("<script") == body.count(own), url
        assert "&lt;script&gt;" in body, url
    assert own in page(relay, f"/runs/{run.id}")  # a failed run: the button is there
    # and the text still reads as it was stored
    assert f"message {EVIL}" in text_of(page(relay, f"/runs/{run.id}"))


def test_page_queries_do_not_grow_with_rows(relay: Relay, store: Store) -> None:
    """No N+1: the same number of SQL statements for 2 commits as for 12. Each page is
    counted three times and the fewest kept: a statement another thread of the app runs
    meanwhile (CI under load once saw one) only ever adds to a count."""

    def statements(url: str) -> int:
        return min(statements_once(url) for _ in range(3))

    def statements_once(url: str) -> int:
        seen: list[str] = []

        def count(*args: Any) -> None:
            seen.append(args[2])

        engine = relay.rt.db.engine
        event.listen(engine, "before_cursor_execute", count)
        try:
            page(relay, url)
        finally:
            event.remove(engine, "before_cursor_execute", count)
        return len(seen)

    def add(first: int, count: int) -> None:
        for n in range(first, first + count):
            change = store.change(sha(n), at=T0 + timedelta(minutes=n), number=9)
            for backend in ("cpu", "spyre"):
                store.run(
                    change,
                    backend,
                    plan=PLAN,
                    conclusion="failure",
                    results=[(f"t.py::test_{n}", "failed", "x"), ("t.py::test_ok", "passed", None)],
                )
        store.session.commit()

    add(200, 2)
    small = {u: statements(u) for u in ("/", "/prs/9", "/trends", "/tests?nodeid=t.py::test_ok")}
    add(300, 10)
    large = {u: statements(u) for u in small}
    assert large == small


def _large_run(store: Store, failures: int) -> int:
    """A finished run with ``failures`` failures (every tenth flaky), each with a long
    traceback; its id."""
    change = store.change(sha(40), number=41)
    run = store.run(
        change, conclusion="failure", plan=PLAN, results=[("t.py::test_ok", "passed", None)]
    )
    shard_id = store.session.query(Shard.id).filter(Shard.run_id == run.id).scalar()
    frames = "".join(
        f'  File "torch/testing/_internal/frame_{k}.py", line {k}\n' for k in range(400)
    )
    store.session.execute(
        insert(TestResult),
        [
            {
                "shard_id": shard_id,
                "nodeid": f"test/test_big.py::TestBig::test_case_{i:04d}",
                "outcome": "flaky" if i % 10 == 0 else "failed",
                "mode": "mandatory_success",
                "duration": 0.5,
                "message": f"AssertionError: case {i}",
                "details": f"Traceback (most recent call last):\n{frames}AssertionError: case {i}",
            }
            for i in range(failures)
        ],
    )
    store.session.commit()
    return run.id


def test_a_run_with_a_thousand_failures_pages_them_with_a_cursor(
    relay: Relay, store: Store
) -> None:
    """1,200 failures of 17 KB each (20 MB of text): every page of the run stays well under
    1 MB, the pages walk every failure exactly once (broken before flaky) through the next
    link and through the JSON API's cursor, and the full text is one link away."""
    run_id = _large_run(store, 1200)
    seen: list[int] = []
    url: str | None = f"/runs/{run_id}"
    while url is not None:
        body = page(relay, url)
        assert len(body.encode()) < 1_000_000, (url, len(body.encode()))
        shown = [int(x) for x in re.findall(r'<li id="failure-(\d+)"', body)]
        assert 0 < len(shown) <= 50
        seen += shown
        if url != f"/runs/{run_id}":
            assert 'rel="first"' in body
        found = re.search(r'<a rel="next" class="failures-next" href="([^"]+)"', body)
        url = html.unescape(found.group(1)).split("#")[0] if found else None
    assert len(seen) == len(set(seen)) == 1200
    assert "Failures (1200)" in body
    with store.session.begin():
        outcomes = dict(store.session.query(TestResult.id, TestResult.outcome).all())
    order = [outcomes[i] for i in seen]
    assert order == sorted(order, key=lambda o: o == "flaky")  # broken first, flaky last
    first = page(relay, f"/runs/{run_id}")
    assert "characters, middle cut" in first  # its head and tail, the middle one link away
    assert "frame_0.py" in first and "frame_399.py" in first
    assert re.search(r'href="/api/results/\d+/details">the whole text', first)

    api: list[int] = []
    cursor: str | None = None
    pages = 0
    while True:
        query = f"?failures_after={cursor}" if cursor else ""
        data = relay.client.get(f"/api/runs/{run_id}/view{query}").json()["run"]
        api += [f["result_id"] for f in data["failures"]]
        assert data["failures_total"] == 1200 and data["failures_after"] == cursor
        pages += 1
        cursor = data["failures_next"]
        if cursor is None:
            break
    assert api == seen and pages == 24
    # a cursor past the end is an empty last page; anything else is refused, not guessed
    data = relay.client.get(f"/api/runs/{run_id}/view?failures_after=0-2147483647").json()["run"]
    assert data["failures"][0]["outcome"] == "flaky" and data["failures_next"] is not None
    data = relay.client.get(f"/api/runs/{run_id}/view?failures_after=1-2147483647").json()["run"]
    assert data["failures"] == [] and data["failures_next"] is None
    for bad in ("2-1", "0-", "abc", "0-1;drop", "0-12345678901"):
        for prefix in (f"/api/runs/{run_id}/view", f"/runs/{run_id}"):
            response = relay.client.get(f"{prefix}?{urlencode({'failures_after': bad})}")
            assert response.status_code == 422, (bad, response.text[:200])
            assert "failures_after" in response.text


def test_the_commit_page_shows_a_large_runs_first_failures_and_sends_to_the_run_page(
    relay: Relay, store: Store
) -> None:
    run_id = _large_run(store, 300)
    body = page(relay, f"/commits/{sha(40)}")
    assert len(body.encode()) < 1_000_000
    assert len(re.findall(r'<li id="failure-', body)) == 50
    assert f'250 more: <a href="/runs/{run_id}#failures">on the run page</a>' in body
