"""What a GitHub event payload means for the relay: a change to test, or nothing.

Only the few fields the relay needs are read, with pydantic models that ignore the rest,
so GitHub adding fields never breaks intake. Those fields are attacker-controlled (anyone
who can open a pull request writes them): each is checked against the shape of its
identifier (:mod:`ci_relay.identifiers`) and a payload with a bad one is refused whole,
naming the field, before anything is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, Field, Strict, ValidationError

from ci_relay.identifiers import (
    MAX_LABELS,
    ActionName,
    CommitId,
    GitRef,
    LabelName,
    PullRequestNumber,
    RepositoryName,
    is_printable_action,
)

ZERO_SHA = "0" * 40

PR_ACTIONS_THAT_RUN = {"opened", "reopened", "synchronize", "labeled"}
PR_ACTIONS = PR_ACTIONS_THAT_RUN | {"closed"}


class InvalidPayload(ValueError):
    """A field the relay reads is missing or has the wrong shape (the request is refused)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @classmethod
    def from_validation(cls, exc: ValidationError, prefix: str = "") -> InvalidPayload:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "missing":
            message = "missing"
        return cls(f"{prefix}{where}", message)


class _Repo(BaseModel):
    full_name: RepositoryName


class _AnyEvent(BaseModel):
    """What every event may carry and the relay stores: its action and repository."""

    action: Any = None  # free text in some events (repository_dispatch): kept when printable
    repository: _Repo | None = None


class _Ref(BaseModel):
    sha: CommitId
    ref: GitRef | None = None


class _Label(BaseModel):
    name: LabelName


class _PullRequest(BaseModel):
    number: Annotated[PullRequestNumber, Strict()]
    head: _Ref
    base: _Ref
    labels: list[_Label] = Field(default_factory=list, max_length=MAX_LABELS)


class _PullRequestEvent(BaseModel):
    action: ActionName
    pull_request: _PullRequest
    repository: _Repo


class _PushEvent(BaseModel):
    ref: GitRef
    before: CommitId
    after: CommitId
    repository: _Repo
    deleted: Annotated[bool, Strict()] = False


class _NightlyEvent(BaseModel):
    """Our own nightly's payload (ci_relay.nightly), or CRCR's nightly in a dispatch."""

    repository: _Repo
    after: CommitId
    before: CommitId | None = None
    ref: GitRef | None = None


class _CheckSubject(BaseModel):
    head_sha: CommitId


class _CheckRunEvent(BaseModel):
    action: ActionName
    repository: _Repo
    check_run: _CheckSubject | None = None
    check_suite: _CheckSubject | None = None


@dataclass(frozen=True)
class ChangeIntent:
    """A change the relay may test (what policy then decides about)."""

    repository: str
    kind: str  # pull_request | push | rerun | nightly
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
    """Read an event payload: the change it asks for, or why it asks for nothing.

    Raises :class:`InvalidPayload` when a field the relay reads is missing from a handled
    event or has the wrong shape in any event.
    """
    try:
        common = _AnyEvent.model_validate(payload)
    except ValidationError as exc:
        raise InvalidPayload.from_validation(exc) from None
    action = common.action if is_printable_action(common.action) else None
    repository = common.repository.full_name if common.repository else None
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
        if event == "nightly":
            nightly = _NightlyEvent.model_validate(payload)
            return Interpretation(
                action,
                repository,
                nightly.after,
                ChangeIntent(
                    repository=nightly.repository.full_name,
                    kind="nightly",
                    head_sha=nightly.after,
                    base_sha=nightly.before,
                    ref=nightly.ref,
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
        raise InvalidPayload.from_validation(exc) from None
    return Interpretation(action, repository, None, None, f"event {event} is not handled")
