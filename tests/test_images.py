"""The production compose file and the image build refer only to things that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ci_relay.execution.runtimes import PODMAN_SOCKET
from ci_relay.settings import Settings
from tests.conftest import CliResult

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker" / "compose.yaml"


def _services() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    services: dict[str, Any] = data["services"]
    return services


def test_every_relay_command_in_compose_is_a_real_cli_invocation() -> None:
    commands = [
        s["command"] for s in _services().values() if s.get("image", "").endswith("relay:latest")
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

    client = docker.DockerClient(base_url=os.environ.get("DOCKER_HOST", PODMAN_SOCKET))
    container = client.containers.run(
        "localhost/ci-relay-relay:latest",
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
