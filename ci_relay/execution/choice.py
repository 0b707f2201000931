"""Which isolation runtime a shard gets, from the settings: fail closed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ci_relay.execution.runtimes import Runtime as Isolation
from ci_relay.execution.runtimes import RuntimeOptions, RuntimeUnavailable, get_runtime
from ci_relay.settings import Settings

log = logging.getLogger("ci_relay.execution")


def shard_runtime(
    settings: Settings, backend: str, say: Callable[[str], None] = log.warning
) -> Isolation:
    """Where a shard's upstream code runs. Fails closed: ``auto`` takes a container when an
    engine and the runner image are there, else the bubblewrap sandbox, else refuses
    (:class:`RuntimeUnavailable`); ``local`` runs only when a person chose it
    (``CI_RELAY_RUNTIME=local``, or ``auto`` under the local demo)."""
    options = runtime_options(settings)
    if settings.runtime != "auto":
        return get_runtime(settings.runtime, backend, options=options)
    reasons = []
    for candidate in ("container", "sandbox"):
        try:
            return get_runtime(candidate, backend, options=options)
        except RuntimeUnavailable as exc:
            reasons.append(f"{candidate}: {exc}")
            say(f"runtime {candidate} unavailable: {exc}")
    if settings.local_demo:
        say("local demo: running shards WITHOUT isolation (runtime local)")
        return get_runtime("local", backend, options=options)
    raise RuntimeUnavailable(
        "no isolating runtime on this worker, so the upstream tests were not run ("
        + "; ".join(reasons)
        + "). Start Podman's socket and build the runner image (ci-relay images build), or "
        "install bubblewrap; CI_RELAY_RUNTIME=local runs upstream code unisolated, only if "
        "a person accepts that"
    )


def runtime_options(settings: Settings) -> RuntimeOptions:
    """What the runtimes need from the settings: the engine, the sandbox's user, and the
    worker's own files that a shard must never read."""
    hidden = [
        p
        for p in (
            settings.settings_file,
            settings.policy_file,
            settings.github_app_private_key_file,
            settings.data_dir,
        )
        if p is not None
    ]
    return RuntimeOptions(
        docker_host=settings.docker_host,
        sandbox_uid=settings.sandbox_uid,
        sandbox_gid=settings.sandbox_gid,
        hidden=tuple(Path(p).resolve() for p in hidden),
    )
