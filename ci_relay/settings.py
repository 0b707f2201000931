"""The one place configuration is read: ``CI_RELAY_*`` variables and an optional YAML file.

Precedence: explicit arguments, then the environment, then the file named by
``CI_RELAY_SETTINGS_FILE``. Secrets are ``SecretStr`` so they never print.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from ci_relay.runtime_defaults import NOBODY, PODMAN_SOCKET
from reuse_specs.backends import SPYRE_DEVICE_GLOB
from test_selection.types import Budget

MiB = 1024 * 1024
SETTINGS_FILE_VARIABLE = "CI_RELAY_SETTINGS_FILE"


class Settings(BaseSettings):
    """Runtime configuration of the relay; every default is the embedded, one-machine one."""

    model_config = SettingsConfigDict(env_prefix="CI_RELAY_", extra="forbid", populate_by_name=True)

    data_dir: Path = Field(default=Path(".ci-relay"), description="SQLite files, broker folders")
    database_url: str | None = Field(default=None, description="default: SQLite in data_dir")
    broker_url: str | None = Field(default=None, description="default: server-less broker")
    webhook_secret: SecretStr | None = None
    dispatch_token: SecretStr | None = None
    policy_file: Path | None = Field(default=None, description="repository allowlist and levels")
    backends_dir: Path | None = Field(
        default=None, description="a folder of backend declarations (beside the bundled ones)"
    )
    max_body_bytes: int = Field(default=25 * MiB, gt=0)
    local_demo: bool = Field(default=False, description="allow serving without a webhook secret")
    upstream_repo: str | None = Field(
        default=None, description="URL or path of the upstream git repository (mirrored locally)"
    )
    specs: list[Path] = Field(default_factory=list, description="reuse spec files to run")
    selection_budget: str = Field(default="15%", description="15% | 600s | 200 | all")
    selection_agent: str = Field(default="local", description="local | llm | none")
    shards_per_run: int = Field(default=1, ge=1)
    llm_url: str | None = None
    llm_model: str | None = None
    llm_api_key: SecretStr | None = None
    runtime: Literal["auto", "container", "sandbox", "local"] = Field(
        default="auto",
        description="where shards run; auto = container, else sandbox, else refuse",
    )
    docker_host: str = Field(
        default=PODMAN_SOCKET,
        validation_alias=AliasChoices("CI_RELAY_DOCKER_HOST", "DOCKER_HOST"),
        description="the container engine's API (Docker, or Podman's compatible socket)",
    )
    sandbox_uid: int = Field(default=NOBODY, ge=1, description="host user of sandboxed tests")
    sandbox_gid: int = Field(default=NOBODY, ge=1, description="host group of sandboxed tests")
    shard_scratch_mb: int = Field(default=2048, gt=0, description="disk a shard may write")
    spyre_device_glob: str = Field(
        default=SPYRE_DEVICE_GLOB, description="Spyre cards, as a pattern under /dev"
    )
    cache_dir: Path | None = Field(
        default=None, description="selector caches; default: $XDG_CACHE_HOME/ci-relay"
    )
    audit_window_seconds: float = Field(
        default=60.0, gt=0, description="rejections of one kind share one audit row this long"
    )
    devices: int = Field(default=1, ge=1, description="accelerator cards of the backend here")
    device_lock_dir: Path = Field(
        default=Path(tempfile.gettempdir()) / "ci-relay-devices",
        description="flock files through which workers on one machine share the cards",
    )
    per_test_timeout: float = Field(default=600.0, gt=0)
    shard_memory_mb: int = Field(default=4096, gt=0)
    task_visibility_timeout: int = Field(default=4 * 3600, gt=0)
    claim_stale_seconds: int = Field(
        default=600,
        gt=0,
        description="a running shard or triage whose worker stopped its heartbeat this long is "
        "taken over (at most task_visibility_timeout)",
    )
    reconcile_after_seconds: int = Field(default=60, gt=0)
    # Reports (ci_relay.reporting): where results go, and what we accept from other relays
    report_name: str = Field(default="ci-relay", description="workflow / check name prefix")
    public_url: str | None = Field(default=None, description="our base URL, for report links")
    downstream_repo: str | None = Field(default=None, description="HUD trusted.verified_repo")
    crcr_callback_url: str | None = None
    crcr_callback_token: SecretStr | None = None
    hud_url: str | None = Field(default=None, description="HUD's .../crcr/results endpoint")
    hud_upload_token: SecretStr | None = Field(default=None, description="sent to hud_url")
    hud_token: SecretStr | None = Field(default=None, description="required by our ingest")
    github_api_url: str = "https://api.github.com"
    github_app_id: str | None = None
    github_app_private_key: SecretStr | None = Field(default=None, description="PEM text")
    github_app_private_key_file: Path | None = None
    github_installation_id: int | None = Field(default=None, description="default: looked up")
    github_token: SecretStr | None = Field(default=None, description="commit statuses")
    report_retry_base_seconds: float = Field(default=5.0, gt=0)
    report_retry_max_seconds: float = Field(default=3600.0, gt=0)
    report_timeout_seconds: float = Field(default=30.0, gt=0)

    # Triage (ci_relay.triage): whose fault a run's failures are, after the run reported
    triage_max_tests: int = Field(
        default=10, ge=0, description="failing tests triaged per run (0: no triage)"
    )
    triage_bisect_steps: int = Field(
        default=6, ge=0, description="runs a bisection of a longer range may take per test"
    )
    triage_agent: Literal["template", "llm"] = Field(
        default="template", description="who writes a verdict's summary (llm: llm_url, llm_model)"
    )
    # Nightly (ci_relay.nightly): the upstream branch head tested once a day
    nightly_at: str | None = Field(
        default=None, pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="HH:MM UTC; off"
    )
    nightly_repository: str | None = Field(
        default=None, description="the upstream repository as the policy names it"
    )
    nightly_branch: str = Field(default="main", pattern=r"^[A-Za-z0-9._/-]{1,200}$")
    nightly_scope: Literal["range", "all"] = Field(
        default="range", description="range: tests the commits since the last nightly touch"
    )
    health_window_days: int = Field(default=14, ge=1, le=365)
    # Per-test coverage maps (test_selection.coverage.map): recorded where the tests run
    coverage_nightly: bool = Field(
        default=True, description="the nightly's shards record which functions each test ran"
    )
    coverage_backends: list[str] = Field(
        default_factory=list, description="backends whose every run records a coverage map"
    )
    coverage_select: bool = Field(
        default=True, description="selection ranks with the newest map of the backend"
    )

    @field_validator("selection_budget")
    @classmethod
    def _budget_reads(cls, value: str) -> str:
        """A budget every selection would refuse is refused at start-up (``0.15`` is not a
        count of tests: the error says it was likely 15%)."""
        Budget.parse(value)
        return value

    @model_validator(mode="after")
    def _reports_are_complete(self) -> Settings:
        """Refuse half-configured reporters at start-up rather than at the first report."""
        if self.hud_url and not self.downstream_repo:
            raise ValueError("CI_RELAY_HUD_URL needs CI_RELAY_DOWNSTREAM_REPO (verified_repo)")
        if self.github_app_id and not (
            self.github_app_private_key or self.github_app_private_key_file
        ):
            raise ValueError("CI_RELAY_GITHUB_APP_ID needs CI_RELAY_GITHUB_APP_PRIVATE_KEY(_FILE)")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        settings_file = os.environ.get(SETTINGS_FILE_VARIABLE)
        if settings_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=settings_file))
        return tuple(sources)

    @property
    def settings_file(self) -> Path | None:
        """The YAML file these settings were read from, if any (shards must not read it)."""
        named = os.environ.get(SETTINGS_FILE_VARIABLE)
        return Path(named) if named else None

    @property
    def effective_cache_dir(self) -> Path:
        from test_selection.inventory import default_cache_dir

        return self.cache_dir if self.cache_dir is not None else default_cache_dir()

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'relay.db').resolve()}"

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url is None

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def broker_folder(self) -> Path:
        return (self.data_dir / "broker").resolve()

    def public_dict(self) -> dict[str, Any]:
        """Settings safe to show: secrets reduced to whether they are set."""
        data = self.model_dump(mode="json")
        for key in (
            "webhook_secret",
            "dispatch_token",
            "crcr_callback_token",
            "hud_upload_token",
            "hud_token",
            "github_app_private_key",
            "github_token",
        ):
            data[key] = "set" if getattr(self, key) else None
        return data
