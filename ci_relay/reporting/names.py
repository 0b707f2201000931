"""How our reports name things; the same names in every target, so they can be matched."""

from __future__ import annotations

from ci_relay.settings import Settings


def job_name(backend: str) -> str:
    """``workflow.job_name`` (part of HUD's key) for one backend's run."""
    return f"test ({backend})"


def check_name(settings: Settings, backend: str) -> str:
    """The GitHub check run name / status context."""
    return f"{settings.report_name} / {job_name(backend)}"


def message_key(mode: str, repository: str, sha: str, name: str) -> str:
    """What GitHub's per-(sha, context) limits count: ``status:owner/repo@sha#context``."""
    return f"{mode}:{repository}@{sha}#{name}"[:512]
