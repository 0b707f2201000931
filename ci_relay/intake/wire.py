"""The intake's wire models: the bodies callers send and what the relay answers. Apart from
the routes, so that reporting can read a stored envelope without loading the web layer."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ci_relay.identifiers import CommitId, DeliveryId, EventName, RepositoryName

# a backend profile's name as the policy writes it (cpu, spyre, spyre-emu)
BackendName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]


class UpgradeRequest(BaseModel):
    """``POST /api/upgrades``: test what changed between two upstream commits, at both."""

    model_config = ConfigDict(extra="forbid")

    repository: RepositoryName
    base: CommitId  # A: the revision the specs are green at
    head: CommitId  # B: the revision to move to
    backends: list[BackendName] | None = Field(
        default=None, max_length=16, description="default: every backend the policy names"
    )


class UpgradeAccepted(BaseModel):
    id: int
    url: str
    state: str


class RerunRequest(BaseModel):
    """``POST /api/runs/{id}/rerun``: queue a finished run that did not pass again."""

    model_config = ConfigDict(extra="forbid")

    failed_only: bool = Field(
        default=False, description="run again only the shards that failed, not the whole plan"
    )


class RerunAccepted(BaseModel):
    id: int
    attempt: int
    rerun_of: int
    scope: str
    url: str
    state: str


class DispatchEnvelope(BaseModel):
    """What PyTorch's Cross-Repository CI Relay sends downstream (``client_payload``)."""

    model_config = ConfigDict(extra="allow")

    event_type: EventName
    delivery_id: DeliveryId
    payload: dict[str, Any]
