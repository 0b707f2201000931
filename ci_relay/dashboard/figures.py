"""Which charts the pages draw, built from views (the geometry lives in :mod:`charts`)."""

from __future__ import annotations

from ci_relay.dashboard.charts import Chart, Series, line_chart
from ci_relay.dashboard.templating import percent, seconds, short_sha
from ci_relay.dashboard.views import TestHistory, Trends


def trend_charts(trends: Trends) -> list[Chart]:
    """Pass rate, selected tests vs the suite, and time to signal, one point per run."""
    points = trends.points
    x_labels = [f"#{p.run_id}" for p in points]
    where = [f"run {p.run_id} · {p.backend} · {short_sha(p.head_sha)}" for p in points]
    return [
        line_chart(
            "Pass rate",
            [
                Series(
                    "pass rate",
                    "line-pass",
                    [p.pass_rate for p in points],
                    [f"{w}: {percent(p.pass_rate)}" for w, p in zip(where, points, strict=True)],
                )
            ],
            x_labels,
            y_format=lambda v: f"{v * 100:.0f}%",
            y_max=1.0,
        ),
        line_chart(
            "Tests selected vs suite size",
            [
                Series(
                    "suite size",
                    "line-universe",
                    [None if p.universe is None else float(p.universe) for p in points],
                    [
                        f"{w}: {p.universe} tests in the suite"
                        for w, p in zip(where, points, strict=True)
                    ],
                ),
                Series(
                    "selected",
                    "line-selected",
                    [None if p.selected is None else float(p.selected) for p in points],
                    [f"{w}: {p.selected} selected" for w, p in zip(where, points, strict=True)],
                ),
            ],
            x_labels,
            y_format=lambda v: f"{v:,.0f}",
        ),
        line_chart(
            "Time to signal (webhook → first result)",
            [
                Series(
                    "time to signal",
                    "line-time",
                    [p.time_to_signal for p in points],
                    [
                        f"{w}: {seconds(p.time_to_signal)}"
                        for w, p in zip(where, points, strict=True)
                    ],
                )
            ],
            x_labels,
            y_format=seconds,
        ),
    ]


def duration_chart(history: TestHistory) -> Chart:
    """A test's recent durations, each point coloured by its outcome."""
    data = history.durations
    return line_chart(
        "Duration",
        [
            Series(
                "duration",
                "line-time",
                [d for _, d, _ in data],
                [f"run {run}: {seconds(d)} ({outcome})" for run, d, outcome in data],
                [f"outcome-{outcome}" for _, _, outcome in data],
            )
        ],
        [f"#{run}" for run, _, _ in data],
        y_format=seconds,
    )
