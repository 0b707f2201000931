"""One settings object: nothing but ``ci_relay.settings`` reads the relay's configuration.

Every use of ``os.environ`` / ``os.getenv`` in the packages is listed here with why it is
not configuration (a convention of another tool, a child process's environment, a write).
A new one fails this test until it either moves into :class:`ci_relay.settings.Settings`
or is reviewed and added with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ci_relay.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ci_relay", "test_selection", "reuse_specs", "spyre_emu")
# (file, enclosing function) -> why reading the environment there is not configuration
REVIEWED = {
    ("ci_relay/settings.py", "settings_customise_sources"): "the settings object itself",
    ("ci_relay/settings.py", "settings_file"): "the settings object itself",
    ("ci_relay/cli/common.py", "_upstream_dir"): "TORCH_ROOT: torch-spyre's name for the checkout",
    ("reuse_specs/loader.py", "load_specs"): "TORCH_ROOT: torch-spyre's name for the checkout",
    (
        "ci_relay/service/processes.py",
        "worker_process",
    ): "the embedded worker inherits the environment",
    ("ci_relay/demo.py", "env"): "the demo relay's environment, minus the caller's CI_RELAY_*",
    ("ci_relay/sample_upstream/__init__.py", "_commit_env"): "git's own GIT_* variables removed",
    ("ci_relay/reporting/job_report.py", "write_github_output"): "GitHub Actions' GITHUB_OUTPUT",
    (
        "ci_relay/reporting/job_report.py",
        "bearer_token",
    ): "a job's token or Actions' OIDC variables",
    ("ci_relay/cli/report.py", "_run_url"): "GitHub Actions' GITHUB_SERVER_URL/REPOSITORY",
    (
        "ci_relay/execution/runtimes/process.py",
        "shard_env",
    ): "PATH/LANG/TZ passed to a shard (allowlist)",
    ("test_selection/agents.py", "_embedding_model"): "writes: keeps the model library offline",
    ("test_selection/inventory.py", "default_cache_dir"): "XDG_CACHE_HOME: the platform's rule",
    ("reuse_specs/pytest_plugin.py", "pytest_configure"): "writes the backend's test variables",
    ("spyre_emu/_lock.py", "lock_dir"): "inside the test process: set by the backend profile",
    ("spyre_emu/profile.py", "profile_from_env"): "inside the test process: set by the backend",
    (
        "ci_relay/cli/specs.py",
        "specs_profile_check",
    ): "SPYRE_EMU_PROFILE: the emulator's own variable, read as the emulator reads it",
    (
        "ci_relay/cli/coverage.py",
        "_run_pytest",
    ): "the recorded repository's pytest inherits the environment, its tree on PYTHONPATH",
}


def _functions() -> dict[tuple[str, str], ast.AST]:
    out: dict[tuple[str, str], ast.AST] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/sample_upstream/commits/" in rel:
                continue  # upstream-shaped test data, not our code
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    out[(rel, node.name)] = node
    return out


def _touches_environment(function: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute)
        and node.attr in ("environ", "getenv")
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    ]


def test_only_reviewed_places_touch_the_environment() -> None:
    uses = {key: lines for key, f in _functions().items() if (lines := _touches_environment(f))}
    unreviewed = {
        f"{file}:{lines[0]} in {function}()"
        for (file, function), lines in uses.items()
        if (file, function) not in REVIEWED
    }
    assert not unreviewed, (
        "read configuration through ci_relay.settings.Settings, or review and list: "
        + ", ".join(sorted(unreviewed))
    )
    stale = set(REVIEWED) - set(uses)
    assert not stale, f"listed but gone (remove from REVIEWED): {sorted(stale)}"


def test_no_relay_variable_is_read_outside_the_settings() -> None:
    """Where the environment is touched outside settings.py, no ``CI_RELAY_*`` name is:
    that would be a second reader of the relay's configuration."""
    functions = _functions()
    offenders = [
        f"{file}:{node.lineno} {node.value}"
        for (file, name) in REVIEWED
        if file != "ci_relay/settings.py" and (file, name) != ("ci_relay/demo.py", "env")
        for node in ast.walk(functions[(file, name)])
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("CI_RELAY_")
    ]
    assert not offenders, offenders


def test_the_settings_hold_what_used_to_be_read_elsewhere() -> None:
    fields = set(Settings.model_fields)
    assert {
        "llm_url",
        "llm_model",
        "llm_api_key",
        "cache_dir",
        "docker_host",
        "spyre_device_glob",
        "sandbox_uid",
        "shard_scratch_mb",
    } <= fields
