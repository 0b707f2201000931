"""Outgoing reports (CRCR callback, PyTorch HUD, GitHub checks/statuses) and the HUD ingest.

A report is an outbox row first (:mod:`ci_relay.reporting.outbox`), rendered and sent
later by a sender (:mod:`ci_relay.reporting.sender`), so nothing is lost when a target
or this process is down. Wire formats live in :mod:`ci_relay.reporting.wire`.
"""
