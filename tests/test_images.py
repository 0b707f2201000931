"""The production compose file and the image build refer only to things that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ci_relay.execution.runtimes import PODMAN_SOCKET
from ci_relay.settings import Settings
from ci_relay.source_digest import TAG_PREFIX
from tests.conftest import CliResult

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker" / "compose.yaml"


def _services() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    services: dict[str, Any] = data["services"]
    return services


def test_every_relay_command_in_compose_is_a_real_cli_invocation() -> None:
    commands = [
        s["command"] for s in _services().values() if "/ci-relay-relay:" in s.get("image", "")
    ]
    assert len(commands) == 3
    for command in commands:
        assert command[0] == "ci-relay"
        proc = subprocess.run(
            [sys.executable, "-m", "ci_relay", *command[1:], "--help"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, f"{command}: {proc.stderr}"


def test_every_setting_in_compose_is_a_known_setting_of_the_right_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = 0
    for name, service in _services().items():
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        relay_env = {k: v for k, v in env.items() if k.startswith("CI_RELAY_")}
        if not relay_env:
            continue
        for key in relay_env:
            assert key.removeprefix("CI_RELAY_").lower() in Settings.model_fields, (name, key)
        with monkeypatch.context() as patch:
            for key in [k for k in os.environ if k.startswith("CI_RELAY_")]:
                patch.delenv(key)
            for key, value in relay_env.items():  # compose's ${VAR:?...} filled in
                patch.setenv(key, re.sub(r"\$\{[^}]*\}", "x", value))
            settings = Settings()  # parsed as the service will: lists, ints, paths, secrets
        assert settings.database_url and settings.database_url.startswith("postgresql")
        seen += 1
    assert seen == 3


def test_every_local_image_has_its_container_file() -> None:
    for service in _services().values():
        image = service.get("image", "")
        if image.startswith("localhost/ci-relay-"):
            target = image.removeprefix("localhost/ci-relay-").split(":")[0]
            assert (ROOT / "docker" / f"{target}.Containerfile").is_file(), image


def test_images_build_refuses_an_unknown_backend(cli: Callable[..., CliResult]) -> None:
    result = cli("images", "build", "--backend", "tpu")
    assert result.code == 2
    assert "unknown backend 'tpu'" in result.stderr


def test_the_spyre_runner_needs_the_spyre_stack(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "ci_relay" / "execution" / "build_images.sh"),
            str(ROOT),
            "runner-spyre",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "CI_RELAY_IMAGE_WORK": str(tmp_path)},
    )
    if "debootstrap failed" in proc.stderr:
        pytest.fail(proc.stderr)
    assert proc.returncode == 2, proc.stderr
    assert "CI_RELAY_SPYRE_BASE_IMAGE" in proc.stderr and "torch_spyre wheel" in proc.stderr


def _compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    files = ("compose.yaml", "compose.local.yaml")
    return subprocess.run(
        ["podman-compose", *(a for f in files for a in ("-f", str(ROOT / "docker" / f))), "config"],
        capture_output=True,
        text=True,
        check=False,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("CI_RELAY_")}, **env},
    )


def test_the_local_compose_stack_uses_only_images_built_here() -> None:
    """Issue 27 item 2: with docker/compose.local.yaml no service needs a registry, every image
    is the one `images build --relay --services` tagged for these sources, and the exec
    worker's data folder is at the same path on both sides (its shard containers mount it)."""
    tag = TAG_PREFIX + "0123456789abcdef"
    refused = _compose_config({"CI_RELAY_WEBHOOK_SECRET": "s"})
    assert refused.returncode != 0
    assert "CI_RELAY_IMAGE_TAG" in refused.stdout + refused.stderr
    proc = _compose_config(
        {"CI_RELAY_WEBHOOK_SECRET": "s", "CI_RELAY_IMAGE_TAG": tag, "CI_RELAY_HOST_DATA": "/srv/r"}
    )
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    assert set(services) == {"api", "worker", "exec-spyre", "postgres", "redis"}
    for name, service in services.items():
        image = service["image"]
        assert image.startswith("localhost/ci-relay-") and image.endswith(f":{tag}"), (name, image)
        target = image.removeprefix("localhost/ci-relay-").split(":")[0]
        assert (ROOT / "docker" / f"{target}.Containerfile").is_file(), image
    for name in ("api", "worker", "exec-spyre"):
        assert services[name]["environment"]["CI_RELAY_DATA_DIR"] == "/srv/r"
        assert "/srv/r:/srv/r" in services[name]["volumes"], services[name]["volumes"]
    assert any(v.endswith(":/run/podman/podman.sock") for v in services["exec-spyre"]["volumes"])


@pytest.mark.container
def test_the_compose_service_images_serve(tmp_path: Path) -> None:
    """The Redis and PostgreSQL images built from Debian's packages (scripts/test.sh builds
    them) start as compose starts them and answer a client, PostgreSQL with the user,
    password and database its first start created."""
    import psycopg
    import redis as redis_client

    import docker
    from ci_relay.demo import free_port
    from ci_relay.source_digest import own_image_tag

    client = docker.DockerClient(base_url=os.environ.get("DOCKER_HOST", PODMAN_SOCKET))
    services = _services()
    pg_port, redis_port = free_port(), free_port()
    started = []
    try:
        started.append(
            client.containers.run(
                f"localhost/ci-relay-postgres:{own_image_tag()}",
                detach=True,
                environment=services["postgres"]["environment"],
                ports={"5432/tcp": ("127.0.0.1", pg_port)},
            )
        )
        started.append(
            client.containers.run(
                f"localhost/ci-relay-redis:{own_image_tag()}",
                detach=True,
                ports={"6379/tcp": ("127.0.0.1", redis_port)},
            )
        )
        url = f"postgresql://relay:relay@127.0.0.1:{pg_port}/relay"
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(url, connect_timeout=2) as conn:
                    assert conn.execute("select current_user, current_database()").fetchone() == (
                        "relay",
                        "relay",
                    )
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise AssertionError(started[0].logs().decode(errors="replace")) from None
                time.sleep(0.3)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(f"postgresql://relay:wrong@127.0.0.1:{pg_port}/relay")
        r = redis_client.Redis("127.0.0.1", redis_port, socket_timeout=2)
        while True:
            try:
                assert r.set("k", "v") and r.get("k") == b"v"
                break
            except redis_client.ConnectionError:
                if time.monotonic() > deadline:
                    raise AssertionError(started[1].logs().decode(errors="replace")) from None
                time.sleep(0.3)
    finally:
        for container in started:
            container.remove(force=True)


@pytest.mark.container
def test_images_build_of_unchanged_inputs_fetches_no_wheels(tmp_path: Path) -> None:
    """Issue 25: the second `images build` of the same sources (scripts/test.sh runs it on
    every run, CI from a fresh clone elsewhere) knows the images are current from the
    checkout alone, without pip, wherever the checkout is."""
    import shutil

    from ci_relay.source_digest import own_image_tag

    clone = tmp_path / "elsewhere"  # the same files at another path: CI's fresh clone
    for name in ("ci_relay", "reuse_specs", "spyre_emu", "test_selection", "docker"):
        shutil.copytree(ROOT / name, clone / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", clone / "pyproject.toml")
    work = tmp_path / "work"  # empty: any wheel fetched would land here
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "CI_RELAY_IMAGE_WORK": str(work),
    }
    proc = subprocess.run(
        ["bash", str(clone / "ci_relay/execution/build_images.sh"), str(clone), "runner-spyre-emu"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("runner-cpu", "runner-spyre-emu"):
        assert re.search(rf"ci-relay-{name}:in-[0-9a-f]{{16}} is up to date", proc.stderr), (
            proc.stderr
        )
    assert "building" not in proc.stderr
    assert sorted(p.name for p in work.iterdir()) == []  # no wheelhouse, no context
    tags = subprocess.run(
        ["podman", "image", "exists", f"localhost/ci-relay-runner-spyre-emu:{own_image_tag()}"],
        check=False,
    )
    assert tags.returncode == 0


PROBE = """
ci-relay serve --port 8000 --local-demo --no-worker >/tmp/serve.log 2>&1 &
for i in $(seq 1 120); do
  if python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/readyz').read().decode())"; then
    exit 0
  fi
  sleep 0.5
done
cat /tmp/serve.log
exit 1
"""


@pytest.mark.container
@pytest.mark.slow
def test_the_relay_image_serves_its_api() -> None:
    """The image built by `ci-relay images build --relay` (scripts/test.sh builds it) starts
    the API, migrates its database and answers /readyz, with no network but loopback."""
    import docker
    from ci_relay.source_digest import own_image_tag

    client = docker.DockerClient(base_url=os.environ.get("DOCKER_HOST", PODMAN_SOCKET))
    container = client.containers.run(
        f"localhost/ci-relay-relay:{own_image_tag()}",
        ["sh", "-c", PROBE],
        detach=True,
        network_mode="none",
        environment={"CI_RELAY_DATA_DIR": "/tmp/relay"},
    )
    try:
        code = container.wait(timeout=300)["StatusCode"]
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert code == 0, logs
    assert '"database":"ok"' in logs, logs
