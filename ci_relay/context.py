"""What every process of the relay shares: settings, database and policy, built once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ci_relay.policy import Policy, load_policy
from ci_relay.settings import Settings
from ci_relay.store.database import Database
from reuse_specs.bundled import BUNDLED_SPECS


@dataclass
class RelayContext:
    settings: Settings

    @cached_property
    def db(self) -> Database:
        return Database(self.settings.effective_database_url)

    @cached_property
    def policy(self) -> Policy:
        return load_policy(self.settings.policy_file)

    @property
    def specs(self) -> list[Path]:
        return self.settings.specs or sorted(BUNDLED_SPECS.glob("*.yaml"))
