"""Prometheus metrics of the API process (one registry per app, so tests stay isolated)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.deliveries = Counter(
            "ci_relay_deliveries_total",
            "Webhook and dispatch requests by event and outcome",
            ["event", "outcome"],
            registry=self.registry,
        )
        self.ack_seconds = Histogram(
            "ci_relay_ack_seconds",
            "Time from request start to the intake answer",
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.pending = Gauge(
            "ci_relay_pending",
            "Work the database says is pending (the queue depth that matters)",
            ["kind"],
            registry=self.registry,
        )
        self.tests = Gauge(
            "ci_relay_tests",
            "Test results stored, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.runs = Gauge("ci_relay_runs", "Runs by state", ["state"], registry=self.registry)
        self.promotion = Gauge(
            "ci_relay_promotion_figure",
            "CRCR's L3 promotion figures over the health window (seconds or a ratio)",
            ["backend", "figure"],
            registry=self.registry,
        )
        self.promotion_threshold = Gauge(
            "ci_relay_promotion_threshold",
            "The L3 bar each promotion figure is judged against",
            ["figure"],
            registry=self.registry,
        )
        self.promotion_met = Gauge(
            "ci_relay_promotion_met",
            "1 when a backend's figure meets the L3 bar, 0 when not (absent: no data)",
            ["backend", "figure"],
            registry=self.registry,
        )
        self.demotion = Gauge(
            "ci_relay_demotion_figure",
            "CRCR's L3 demotion figures over the fixed 7 days (seconds or a ratio)",
            ["backend", "figure"],
            registry=self.registry,
        )
        self.demotion_met = Gauge(
            "ci_relay_demotion_met",
            "1 when a backend's demotion figure is within its target, 0 when not",
            ["backend", "figure"],
            registry=self.registry,
        )
        self.readiness = Gauge(
            "ci_relay_readiness",
            "1 for each backend's L3 readiness state (ready, not ready, within targets, "
            "temporarily demoted, demoted), 0 for the others",
            ["backend", "state"],
            registry=self.registry,
        )
