"""L3 readiness as CRCR judges it now (issue 56, item 1): pull-request jobs only, latest
attempts only, the job success rate, the overrun rate in place of the longest execution,
promotion over 14 days with 30 days at L2, demotion over the fixed 7 days on three figures
(strict complement), and the states ready / not ready / within targets / temporarily demoted /
demoted, the same on ``/health``, ``/api/health`` and ``/metrics``. Runs written as the
pipeline writes them, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from ci_relay.store.models import Run, utcnow
from tests.relay_fixtures import Relay
from tests.test_dashboard import Store, sha, text_of

TIMEOUT = "the test ran longer than its 600s timeout and was killed"
HOUR = 3600


@pytest.fixture
def store(relay: Relay) -> Iterator[Store]:
    with relay.rt.db.session() as session:
        yield Store(session)


class Seed:
    """Runs of pull requests (unless said), each ``queue`` s in the queue and ``execution`` s
    running, finished ``ago`` before now."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.now = utcnow()
        self.n = 0

    def run(
        self,
        backend: str,
        ago: timedelta,
        *,
        queue: float = 60,
        execution: float = 600,
        conclusion: str = "success",
        level: str = "L2",
        kind: str = "pull_request",
        timed_out: bool = False,
    ) -> Run:
        self.n += 1
        start = self.now - ago - timedelta(seconds=queue + execution)
        results = [(f"test/t.py::TestT::test_{self.n}", "crashed", TIMEOUT)] if timed_out else []
        run = self.store.run(
            self.store.change(sha(1000 + self.n), at=start, kind=kind),
            backend,
            conclusion=conclusion,
            results=results,
        )
        run.level = level
        assert run.started_at is not None
        run.started_at = run.created_at + timedelta(seconds=queue)
        run.finished_at = run.started_at + timedelta(seconds=execution)
        return run


def _by_backend(relay: Relay, days: int | None = None) -> dict[str, Any]:
    url = "/api/health" + (f"?days={days}" if days else "")
    return {b["backend"]: b for b in relay.client.get(url).json()["backends"]}


def _figures(backend: dict[str, Any], which: str = "figures") -> dict[str, Any]:
    return {f["key"]: f for f in backend[which]}


def test_promotion_counts_pull_request_jobs_latest_attempts_with_crcr_figures(
    relay: Relay, store: Store
) -> None:
    seed = Seed(store)
    seed.run("cpu", timedelta(days=40))  # its first L2 run: 40 days at L2
    seed.run("cpu", timedelta(days=1), queue=60, execution=600)
    seed.run("cpu", timedelta(days=2), queue=120, execution=1200)
    seed.run("cpu", timedelta(days=3), queue=3000, execution=3600, conclusion="failure",
             timed_out=True)  # fmt: skip
    seed.run("cpu", timedelta(days=4), execution=4 * HOUR)  # over 3 h, not timed out
    first = seed.run("cpu", timedelta(days=5), conclusion="failure")
    again = seed.run("cpu", timedelta(days=4, hours=12))  # its second attempt passed
    again.rerun_of = first.id
    seed.run("cpu", timedelta(days=1), conclusion="failure", kind="push")  # not a PR job
    seed.run("cpu", timedelta(days=1), conclusion="failure", kind="upgrade")
    store.session.commit()

    cpu = _by_backend(relay)["cpu"]
    figures = _figures(cpu)
    assert cpu["runs"] == 5  # 60-600, 120-1200, the timeout, the overrun, the rerun
    assert figures["pass_rate"]["value"] == pytest.approx(4 / 5)
    assert figures["pass_rate"]["met"] is False and figures["pass_rate"]["threshold"] == 0.9
    assert figures["timeout_rate"]["value"] == pytest.approx(1 / 5)
    # the overrun among the four that did not time out (the 4 h run); no longest-execution bar
    assert figures["overrun_rate"]["value"] == pytest.approx(1 / 4)
    assert "execution_max" not in figures
    assert figures["queue_time_avg"]["value"] == pytest.approx((60 + 120 + 3000 + 60 + 60) / 5)
    assert figures["time_at_l2"]["value"] == pytest.approx(40 + 660 / 86400, abs=0.01)
    assert figures["time_at_l2"]["met"] is True
    assert figures["end_to_end_p50"]["value"] == pytest.approx(1320.0)  # 660 660 1320 6600 14460
    assert cpu["state"] == "not ready" and cpu["ready"] is False
    assert any(r.startswith("job success rate: 80.0% over 14 days") for r in cpu["reasons"])
    # the demotion window is fixed at 7 days and judges three figures only
    assert {f["key"] for f in cpu["demotion_figures"]} == {
        "pass_rate", "timeout_rate", "end_to_end_p50",
    }  # fmt: skip
    assert all(f["window_days"] == 7 for f in cpu["demotion_figures"])


def test_each_state_with_its_reasons(relay: Relay, store: Store) -> None:
    seed = Seed(store)
    for day in (45, 5, 3, 1):  # ready: 45 days at L2, every figure met
        seed.run("cpu", timedelta(days=day))
    seed.run("spyre-emu", timedelta(days=10))  # too new at L2: not ready on tenure alone
    for day in (20, 2):  # at L3 and within its targets over 7 days
        seed.run("spyre", timedelta(days=day), level="L3")
    seed.run("emu-timeouts", timedelta(days=30), level="L3")
    seed.run("emu-timeouts", timedelta(days=2), level="L3", conclusion="failure", timed_out=True)
    seed.run("emu-quiet", timedelta(days=10), level="L3")  # nothing in the last 7 days
    seed.run("emu-back", timedelta(days=6), level="L3")
    seed.run("emu-back", timedelta(days=1), level="L2")  # moved back to L2
    store.session.commit()

    by = _by_backend(relay)
    assert (by["cpu"]["state"], by["cpu"]["ready"], by["cpu"]["reasons"]) == ("ready", True, [])
    emu = by["spyre-emu"]
    assert emu["state"] == "not ready"
    assert emu["reasons"] == ["time at L2 or above: 10.0 days over 14 days (needs >= 30.0 days)"]
    assert (by["spyre"]["level"], by["spyre"]["state"]) == ("L3", "within targets")
    timeouts = by["emu-timeouts"]
    assert timeouts["state"] == "temporarily demoted"
    assert any(r.startswith("timeout rate: 100.0% over 7 days") for r in timeouts["reasons"])
    assert _figures(timeouts, "demotion_figures")["timeout_rate"]["met"] is False
    assert by["emu-quiet"]["state"] == "temporarily demoted"
    assert by["emu-quiet"]["reasons"] == ["no pull-request run in the last 7 days"]
    assert by["emu-back"]["state"] == "demoted"


def test_the_page_and_the_gauges_say_the_same(relay: Relay, store: Store) -> None:
    seed = Seed(store)
    seed.run("spyre", timedelta(days=10), level="L3")
    seed.run("spyre", timedelta(days=1), level="L3", conclusion="failure", timed_out=True)
    seed.run("cpu", timedelta(days=2))
    store.session.commit()
    response = relay.client.get("/health")
    assert response.status_code == 200
    text = text_of(response.text)
    assert "spyre · L3 · 2 runs · temporarily demoted" in text
    assert "timeout rate: 100.0% over 7 days (needs < 1.0%)" in text
    assert "cpu · L2 · 1 run · not ready" in text
    assert "job success rate 100.0% ≥ 90.0% yes 100.0% < 90.0%" in text  # cpu's
    assert "job success rate 50.0% ≥ 90.0% no 0.0% < 90.0%" in text  # spyre's: 14 and 7 days
    metrics = relay.client.get("/metrics").text
    assert 'ci_relay_readiness{backend="spyre",state="temporarily demoted"} 1.0' in metrics
    assert 'ci_relay_readiness{backend="spyre",state="within targets"} 0.0' in metrics
    assert 'ci_relay_demotion_figure{backend="spyre",figure="pass_rate"} 0.0' in metrics
    assert 'ci_relay_demotion_met{backend="spyre",figure="timeout_rate"} 0.0' in metrics
    assert 'ci_relay_promotion_figure{backend="spyre",figure="pass_rate"} 0.5' in metrics
    assert 'ci_relay_promotion_threshold{figure="overrun_rate"} 0.01' in metrics
    assert 'ci_relay_readiness{backend="cpu",state="not ready"} 1.0' in metrics


def test_the_promotion_window_moves_and_the_demotion_window_does_not(
    relay: Relay, store: Store
) -> None:
    seed = Seed(store)
    seed.run("spyre", timedelta(days=20), level="L3", conclusion="failure")
    seed.run("spyre", timedelta(days=1), level="L3")
    store.session.commit()
    narrow = _by_backend(relay)["spyre"]
    assert narrow["runs"] == 1 and _figures(narrow)["pass_rate"]["value"] == 1.0
    wide = _by_backend(relay, days=30)["spyre"]
    assert wide["runs"] == 2 and _figures(wide)["pass_rate"]["value"] == 0.5
    assert wide["demotion_runs"] == 1 and wide["state"] == "within targets"


def test_an_empty_window_says_so(relay: Relay) -> None:
    assert relay.client.get("/api/health").json()["backends"] == []
    assert "No finished run in the window." in relay.client.get("/health").text
    assert relay.client.get("/api/health?days=0").status_code == 422


def test_a_datetime_without_zone_compares_as_utc() -> None:
    from datetime import UTC

    from ci_relay.dashboard.queries.health import _after

    since = datetime(2026, 1, 2, tzinfo=UTC)
    assert _after(datetime(2026, 1, 2, 0, 0, 1), since)
    assert not _after(datetime(2026, 1, 1, 23, 59), since)
    assert not _after(None, since)


def test_each_figure_leads_to_the_runs_behind_it_then_the_unfinished_and_overdue(
    relay: Relay, store: Store
) -> None:
    from ci_relay.store.models import Triage

    seed = Seed(store)
    failed = seed.run("spyre", timedelta(days=1), level="L3", conclusion="failure")
    store.session.add(Triage(run=failed, state="done", verdict={"category": "upstream"}))
    seed.run("spyre", timedelta(days=2), level="L3", conclusion="failure", timed_out=True)
    long = seed.run("spyre", timedelta(days=3), level="L3", execution=4 * HOUR)
    slow_queue = seed.run("spyre", timedelta(days=4), level="L3", queue=40 * 60)
    seed.run("spyre", timedelta(days=5), level="L3")  # passed, quick: behind nothing
    seed.run("cpu", timedelta(days=1), conclusion="failure")  # another backend's
    now = utcnow()
    running = store.run(store.change(sha(1), at=now - timedelta(hours=5)), "spyre", state="running",
                        conclusion=None)  # fmt: skip
    waiting = store.run(store.change(sha(2), at=now - timedelta(minutes=45)), "spyre",
                        state="pending", conclusion=None)  # fmt: skip
    waiting.started_at = None
    fresh = store.run(store.change(sha(3), at=now - timedelta(minutes=5)), "spyre",
                      state="pending", conclusion=None)  # fmt: skip
    fresh.started_at = None
    store.session.commit()

    def behind(figure: str) -> dict[str, Any]:
        got = relay.client.get(f"/api/health/spyre?figure={figure}")
        assert got.status_code == 200, got.text
        return dict(got.json())

    passing = behind("pass_rate")
    assert [r["why"] for r in passing["runs"]] == ["ended failure", "ended failure"]
    assert {r["run_id"]: r["triage"] for r in passing["runs"]}[failed.id] == "upstream"
    assert [r["run_id"] for r in behind("overrun_rate")["runs"]] == [long.id]
    assert [r["run_id"] for r in behind("queue_time_avg")["runs"]] == [slow_queue.id]
    assert behind("timeout_rate")["runs"][0]["why"] == "a test or a shard hit its time limit"
    assert [r["run_id"] for r in behind("end_to_end_p50")["runs"]] == [long.id]
    quiet = behind("")
    assert quiet["runs"] == [] and quiet["overdue"] == 2
    assert [r["run_id"] for r in quiet["unfinished"]] == [running.id, waiting.id, fresh.id]
    assert quiet["unfinished"][0]["why"].startswith("overdue: going for 5.0 h")
    assert quiet["unfinished"][1]["why"].startswith("overdue: queued 45 min without starting")
    assert quiet["unfinished"][2]["why"] == "pending"
    # from the readiness page, each figure is a link to its runs
    page = relay.client.get("/health").text
    assert 'href="/health/spyre?figure=pass_rate&amp;days=14"' in page
    html = text_of(relay.client.get("/health/spyre?figure=pass_rate").text)
    assert "Behind the job success rate: 2 runs" in html and "upstream" in html
    assert "Unfinished: 3, 2 overdue" in html
    for bad in ("/health/spyre?figure=bogus", "/api/health/BAD!", "/api/health/spyre?days=0"):
        assert relay.client.get(bad).status_code in (404, 422), bad
