"""L3 readiness (``/health``, ``/api/health``, Prometheus): CRCR's promotion figures per
backend over the window, from runs written as the pipeline writes them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from ci_relay.store.models import Run, utcnow
from tests.relay_fixtures import Relay
from tests.test_dashboard import Store, sha, text_of


@pytest.fixture
def store(relay: Relay) -> Iterator[Store]:
    with relay.rt.db.session() as session:
        yield Store(session)


def _timed(run: Run, queue: float, execution: float) -> None:
    assert run.started_at is not None
    run.started_at = run.created_at + timedelta(seconds=queue)
    run.finished_at = run.started_at + timedelta(seconds=execution)


def _seed(store: Store) -> None:
    now = utcnow()
    for i, (queue, execution, conclusion, outcome, message) in enumerate(
        [
            (60, 600, "success", "passed", None),
            (120, 1200, "success", "passed", None),
            (
                3000,
                3600,
                "failure",
                "crashed",
                "the test ran longer than its 600s timeout and was killed",
            ),
        ]
    ):
        change = store.change(sha(100 + i), at=now - timedelta(days=1, hours=i))
        run = store.run(
            change,
            "cpu",
            conclusion=conclusion,
            results=[(f"test/t.py::TestTCPU::test_{i}_cpu", outcome, message)],
        )
        _timed(run, queue, execution)
    ready = store.run(store.change(sha(200), at=now - timedelta(hours=3)), "spyre-emu")
    _timed(ready, 30, 90)
    old = store.run(
        store.change(sha(201), at=now - timedelta(days=20)), "spyre-emu", conclusion="failure"
    )
    _timed(old, 99_999, 99_999)  # outside the 14-day window
    upgrade = store.run(
        store.change(sha(202), at=now - timedelta(hours=2), kind="upgrade"),
        "spyre-emu",
        conclusion="failure",
    )
    _timed(upgrade, 10, 10)  # a release range for the spec maintainers: not a PR job
    store.session.commit()


def test_the_five_figures_beside_their_thresholds(relay: Relay, store: Store) -> None:
    _seed(store)
    health = relay.client.get("/api/health").json()
    assert health["window_days"] == 14
    by = {b["backend"]: b for b in health["backends"]}
    assert set(by) == {"cpu", "spyre-emu"}
    cpu = {f["key"]: f for f in by["cpu"]["figures"]}
    assert by["cpu"]["runs"] == 3 and by["cpu"]["ready"] is False
    assert cpu["queue_time_avg"]["value"] == pytest.approx(1060.0)
    assert cpu["queue_time_avg"]["threshold"] == 1800.0 and cpu["queue_time_avg"]["met"] is True
    assert cpu["execution_max"]["value"] == pytest.approx(3600.0) and cpu["execution_max"]["met"]
    assert cpu["end_to_end_p50"]["value"] == pytest.approx(1320.0)  # median of 660, 1320, 6600
    assert (
        cpu["timeout_rate"]["value"] == pytest.approx(1 / 3) and cpu["timeout_rate"]["met"] is False
    )
    assert cpu["pass_rate"]["value"] == pytest.approx(2 / 3) and cpu["pass_rate"]["met"] is False
    emu = by["spyre-emu"]
    assert emu["runs"] == 1 and emu["ready"] is True  # the old and the upgrade runs left out
    wide = relay.client.get("/api/health?days=30").json()
    assert {b["backend"]: b["runs"] for b in wide["backends"]}["spyre-emu"] == 2


def test_the_page_and_the_gauges_say_the_same(relay: Relay, store: Store) -> None:
    _seed(store)
    response = relay.client.get("/health")
    assert response.status_code == 200
    text = text_of(response.text)
    assert "cpu · 3 runs · not yet" in text and "spyre-emu · 1 run · meets the L3 bar" in text
    assert "job pass rate 66.7% > 90.0% no" in text
    metrics = relay.client.get("/metrics").text
    assert 'ci_relay_promotion_figure{backend="cpu",figure="pass_rate"} 0.6666' in metrics
    assert 'ci_relay_promotion_met{backend="spyre-emu",figure="timeout_rate"} 1.0' in metrics
    assert 'ci_relay_promotion_threshold{figure="end_to_end_p50"} 10800.0' in metrics


def test_an_empty_window_says_so(relay: Relay) -> None:
    assert relay.client.get("/api/health").json()["backends"] == []
    assert "No finished run in the window." in relay.client.get("/health").text
    assert relay.client.get("/api/health?days=0").status_code == 422
