"""CRCR levels as they decide GitHub reports: who gets a check, and whether it blocks.

L1 and L2 runs report to HUD only. L3 runs get a non-blocking check, and only on pull
requests labelled ``ciflow/crcr/<device>`` (a failure concludes ``neutral``). L4 runs get
a blocking check on every pull request. The level and labels are the ones the run was
started with (``Run.level``, ``Change.labels``), so a report matches why the run exists.
"""

from __future__ import annotations

from typing import Any, Literal

from ci_relay.policy import Level, Policy
from ci_relay.reporting.names import check_name, message_key
from ci_relay.settings import Settings
from ci_relay.store.models import Run

GitHubMode = Literal["check", "status"]


def device_of(policy: Policy, repository: str, backend: str) -> str:
    repo = policy.for_repository(repository)
    backend_policy = repo.backends.get(backend) if repo else None
    return (backend_policy.device if backend_policy else None) or backend


def github_mode(settings: Settings, policy: Policy, run: Run) -> GitHubMode | None:
    """How this run reports to GitHub: a check run (App), a commit status (token), or not."""
    if settings.github_app_id:
        mode: GitHubMode = "check"
    elif settings.github_token:
        mode = "status"
    else:
        return None
    change = run.change
    if change.number is None:  # checks belong on pull requests
        return None
    if run.level == Level.L4:
        return mode
    if run.level == Level.L3:
        label = f"ciflow/crcr/{device_of(policy, change.repository, run.backend)}"
        return mode if label in change.labels else None
    return None


def github_plan(
    settings: Settings, policy: Policy, run: Run, event: str
) -> tuple[dict[str, Any], str] | None:
    """The outbox payload and key of this run's GitHub report, or None if its level says no."""
    mode = github_mode(settings, policy, run)
    if mode is None:
        return None
    name = check_name(settings, run.backend)
    return {"event": event, "mode": mode}, message_key(
        mode, run.change.repository, run.change.head_sha, name
    )


def blocking(level: str) -> bool:
    return level == Level.L4


def check_conclusion(level: str, conclusion: str | None) -> str:
    """GitHub's check conclusion for our run's: L3 never shows red, L4 does."""
    if conclusion in ("failure", "error"):
        return "failure" if blocking(level) else "neutral"
    return conclusion if conclusion in ("success", "neutral") else "neutral"


def status_state(level: str, conclusion: str | None) -> str:
    """Commit statuses have no ``neutral``: a non-blocking failure is posted as ``success``
    and said in the description."""
    if conclusion == "success" or conclusion == "neutral" or not blocking(level):
        return "success"
    return "error" if conclusion == "error" else "failure"
