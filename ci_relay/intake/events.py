"""What a GitHub event payload means for the relay: a change to test, or nothing.

Only the few fields the relay needs are read, with pydantic models that
ignore the rest, so GitHub adding fields never breaks intake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

ZERO_SHA = "0" * 40

PR_ACTIONS_THAT_RUN = {"opened", "reopened", "synchronize", "labeled"}
PR_ACTIONS = PR_ACTIONS_THAT_RUN | {"closed"}


class _Repo(BaseModel):
    full_name: str


class _Ref(BaseModel):
    sha: str
    ref: str | None = None


class _Label(BaseModel):
    name: str


class _PullRequest(BaseModel):
    number: int
    head: _Ref
    base: _Ref
    labels: list[_Label] = []


class _PullRequestEvent(BaseModel):
    action: str
    pull_request: _PullRequest
    repository: _Repo


class _PushEvent(BaseModel):
    ref: str
    before: str
    after: str
    repository: _Repo
    deleted: bool = False


class _CheckSubject(BaseModel):
    head_sha: str


class _CheckRunEvent(BaseModel):
    action: str
    repository: _Repo
    check_run: _CheckSubject | None = None
    check_suite: _CheckSubject | None = None


@dataclass(frozen=True)
class ChangeIntent:
    """A change the relay may test (what policy then decides about)."""

    repository: str
    kind: str  # pull_request | push | rerun
    head_sha: str
    base_sha: str | None = None
    number: int | None = None
    ref: str | None = None
    labels: list[str] = field(default_factory=list)
    runs_tests: bool = True


@dataclass(frozen=True)
class Interpretation:
    """Summary fields for the delivery row, plus the change (None = ignore, with reason)."""

    action: str | None
    repository: str | None
    head_sha: str | None
    change: ChangeIntent | None
    ignore_reason: str | None = None


def summarize(event: str, payload: dict[str, Any]) -> Interpretation:
    """Read an event payload; never raises on unexpected shapes (they become 'ignored')."""
    action = payload.get("action") if isinstance(payload.get("action"), str) else None
    repo = payload.get("repository")
    repository = repo.get("full_name") if isinstance(repo, dict) else None
    try:
        if event == "pull_request":
            pr_event = _PullRequestEvent.model_validate(payload)
            pr = pr_event.pull_request
            if pr_event.action not in PR_ACTIONS:
                return Interpretation(
                    action, repository, pr.head.sha, None, f"pull_request action {action}"
                )
            return Interpretation(
                action,
                repository,
                pr.head.sha,
                ChangeIntent(
                    repository=pr_event.repository.full_name,
                    kind="pull_request",
                    head_sha=pr.head.sha,
                    base_sha=pr.base.sha,
                    number=pr.number,
                    ref=pr.head.ref,
                    labels=[label.name for label in pr.labels],
                    runs_tests=pr_event.action in PR_ACTIONS_THAT_RUN,
                ),
            )
        if event == "push":
            push = _PushEvent.model_validate(payload)
            if push.deleted or push.after == ZERO_SHA:
                return Interpretation(action, repository, None, None, f"{push.ref} was deleted")
            if not push.ref.startswith("refs/heads/"):
                return Interpretation(action, repository, push.after, None, f"push to {push.ref}")
            return Interpretation(
                action,
                repository,
                push.after,
                ChangeIntent(
                    repository=push.repository.full_name,
                    kind="push",
                    head_sha=push.after,
                    base_sha=None if push.before == ZERO_SHA else push.before,
                    ref=push.ref,
                ),
            )
        if event in ("check_run", "check_suite"):
            check = _CheckRunEvent.model_validate(payload)
            subject = check.check_run or check.check_suite
            sha = subject.head_sha if subject else None
            if check.action != "rerequested" or sha is None:
                return Interpretation(action, repository, sha, None, f"{event} action {action}")
            return Interpretation(
                action,
                repository,
                sha,
                ChangeIntent(repository=check.repository.full_name, kind="rerun", head_sha=sha),
            )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return Interpretation(
            action, repository, None, None, f"{event} payload lacks {where}: {first['msg']}"
        )
    return Interpretation(action, repository, None, None, f"event {event} is not handled")
