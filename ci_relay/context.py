"""What every process of the relay shares: settings, database and policy, built once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ci_relay.policy import Policy, load_policy, register_backends_dir
from ci_relay.settings import Settings
from ci_relay.store.database import Database
from reuse_specs.backends import add_backends_dir
from reuse_specs.bundled import BUNDLED_SPECS


@dataclass
class RelayContext:
    settings: Settings

    def __post_init__(self) -> None:
        # every process of the relay knows the declared backends before any step asks
        if self.settings.backends_dir is not None:
            add_backends_dir(self.settings.backends_dir)
        register_backends_dir(self.settings.policy_file)

    @cached_property
    def db(self) -> Database:
        return Database(self.settings.effective_database_url)

    @cached_property
    def policy(self) -> Policy:
        return load_policy(self.settings.policy_file)

    @property
    def specs(self) -> list[Path]:
        return self.settings.specs or sorted(BUNDLED_SPECS.glob("*.yaml"))
