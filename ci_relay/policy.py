"""Which repositories the relay accepts, and at which CRCR level each backend runs.

Levels follow PyTorch's Cross-Repository CI Relay: L1 record events only; L2
run and publish results; L3 run only on pull requests labelled
``ciflow/crcr/<device>``; L4 run on every change.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ci_relay.identifiers import RepositoryName
from reuse_specs.backends import BACKENDS, add_backends_dir


class Level(StrEnum):
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    L4 = "L4"


class BackendPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    level: Level = Level.L2
    device: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$",
        description="label suffix (ciflow/crcr/<device>); default: backend name",
    )
    label: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="run only spec entries with this label on this backend (torch-spyre's "
        "TORCH_SPYRE_TEST_TYPE); default: every entry",
    )
    nightly_only: bool = Field(
        default=False,
        description="run on nightly dispatches only (CRCR's nightly-only L2): a pull request "
        "or push is recorded with this backend skipped, never queued",
    )
    selection: Literal["ranked", "safe"] = Field(
        default="ranked",
        description="ranked: the selection budget spent by rank, the coverage floor first; "
        "safe: no budget, every test the change reaches (by the coverage map, import or name)",
    )


class RepositoryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backends: dict[str, BackendPolicy] = Field(default_factory=dict)

    @field_validator("backends")
    @classmethod
    def _known_backends(cls, value: dict[str, BackendPolicy]) -> dict[str, BackendPolicy]:
        """A backend names a queue (``exec.<backend>``) and a runner image: only known ones."""
        unknown = sorted(set(value) - set(BACKENDS))
        if unknown:
            raise ValueError(
                f"unknown backend(s) {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(sorted(BACKENDS))})"
            )
        return value


class Policy(BaseModel):
    """``repositories: {owner/name: {backends: {cpu: {level: L2}}}}``; others are ignored.
    ``backends_dir``: a folder of backend declarations (relative to the policy file) whose
    backends the repositories may name, as with ``CI_RELAY_BACKENDS_DIR``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backends_dir: str | None = Field(
        default=None, min_length=1, description="backend declarations (relative to this file)"
    )

    repositories: dict[RepositoryName, RepositoryPolicy] = Field(default_factory=dict)

    def for_repository(self, name: str | None) -> RepositoryPolicy | None:
        return self.repositories.get(name) if name else None

    @staticmethod
    def skipped_for(repo: RepositoryPolicy, kind: str) -> list[dict[str, str]]:
        """The backends that would run but are nightly only, for a change that is not a
        nightly, with why (stored on the change: the dashboard and the API say it)."""
        if kind == "nightly":
            return []
        return [
            {
                "backend": backend,
                "reason": f"nightly only under the policy: not run for a {kind.replace('_', ' ')}",
            }
            for backend, policy in sorted(repo.backends.items())
            if policy.nightly_only and policy.level is not Level.L1
        ]

    def selection_for(self, repository: str | None, backend: str) -> str:
        """How this backend's runs select for this repository (``ranked`` or ``safe``)."""
        repo = self.for_repository(repository)
        backend_policy = repo.backends.get(backend) if repo else None
        return backend_policy.selection if backend_policy else "ranked"

    def label_for(self, repository: str | None, backend: str) -> str | None:
        """The spec label this backend runs for this repository (None: every entry)."""
        repo = self.for_repository(repository)
        backend_policy = repo.backends.get(backend) if repo else None
        return backend_policy.label if backend_policy else None

    @staticmethod
    def runs_for(repo: RepositoryPolicy, kind: str, labels: list[str]) -> list[tuple[str, Level]]:
        """The (backend, level) pairs that run for a change of this kind with these labels."""
        out: list[tuple[str, Level]] = []
        for backend, policy in sorted(repo.backends.items()):
            device = policy.device or backend
            if policy.level is Level.L1:
                continue
            if policy.nightly_only and kind != "nightly":
                continue
            if policy.level is Level.L3 and not (
                (kind == "pull_request" and f"ciflow/crcr/{device}" in labels)
                or kind == "nightly"  # the nightly reports for every level that runs tests
            ):
                continue
            out.append((backend, policy.level))
        return out


class PolicyError(ValueError):
    pass


def register_backends_dir(path: Path | None) -> None:
    """The policy's ``backends_dir`` joins this process's backends (before anything asks for
    one of them: a worker that never validates the policy still runs its backends)."""
    if path is None:
        return
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return  # load_policy reports it
    folder = data.get("backends_dir") if isinstance(data, dict) else None
    if isinstance(folder, str) and folder:
        add_backends_dir(path.parent / folder)


def load_policy(path: Path | None) -> Policy:
    """Read the policy file; no file means an empty allowlist (nothing runs)."""
    if path is None:
        return Policy()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        register_backends_dir(path)  # before the repositories: they may name its backends
        return Policy.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise PolicyError(f"policy file {path}: {exc}") from exc
