"""The embedded demo: a relay on this machine, fed one real change of the sample upstream."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ci_relay.intake.signature import sign
from ci_relay.sample_upstream import SampleUpstream, build_sample_upstream
from ci_relay.service.processes import die_with_parent

SAMPLE_REPOSITORY = "sample/pytorch"


def pull_request_payload(
    sample: SampleUpstream, head_index: int, number: int = 1
) -> dict[str, Any]:
    """A ``pull_request`` / ``synchronize`` payload (GitHub's shape) for one sample commit."""
    head = sample.commits[head_index]
    base = sample.commits[head_index - 1]
    repo = {"id": 1, "name": "pytorch", "full_name": SAMPLE_REPOSITORY, "private": False}
    return {
        "action": "synchronize",
        "number": number,
        "before": base.sha,
        "after": head.sha,
        "pull_request": {
            "number": number,
            "state": "open",
            "title": head.message,
            "head": {"sha": head.sha, "ref": f"pr-{number}", "repo": repo},
            "base": {"sha": base.sha, "ref": "main", "repo": repo},
            "labels": [{"name": "ciflow/crcr/cpu"}, {"name": "ciflow/crcr/spyre"}],
        },
        "repository": repo,
        "sender": {"login": "sample-bot", "type": "Bot"},
    }


def send_webhook(base_url: str, secret: str, event: str, payload: dict[str, Any]) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-GitHub-Hook-ID": "1",
        "X-Hub-Signature-256": sign(secret, body),
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/ci-relay-demo",
    }
    return httpx.post(f"{base_url}/webhooks/github", content=body, headers=headers, timeout=10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class DemoRelay:
    """A ``ci-relay serve`` child process in embedded mode, set up for the sample upstream."""

    workdir: Path
    port: int
    secret: str
    process: subprocess.Popen[bytes] | None = None
    # the CPU reference and the emulated Spyre card (L3: the PR carries both labels)
    backends: tuple[str, ...] = ("cpu", "spyre-emu")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, sample: SampleUpstream) -> dict[str, str]:
        policy = self.workdir / "policy.yaml"
        lines = [f"repositories:\n  {SAMPLE_REPOSITORY}:\n    backends:\n"]
        for backend in self.backends:
            device = "spyre" if backend.startswith("spyre") else backend
            lines.append(f"      {backend}: {{level: L3, device: {device}}}\n")
        policy.write_text("".join(lines))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CI_RELAY_")}
        env.update(
            CI_RELAY_DATA_DIR=str(self.workdir / "data"),
            CI_RELAY_WEBHOOK_SECRET=self.secret,
            CI_RELAY_POLICY_FILE=str(policy),
            CI_RELAY_UPSTREAM_REPO=str(sample.path),
            CI_RELAY_RECONCILE_AFTER_SECONDS="10",
            # a person started the demo on their own machine with a sample upstream: without
            # Podman or bubblewrap its tests may run unisolated (marked "not isolated")
            CI_RELAY_LOCAL_DEMO="true",
        )
        return env

    def start(self, sample: SampleUpstream, log_file: Path) -> None:
        with log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ci_relay", "serve", "--port", str(self.port)],
                env=self.env(sample),
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # however the demo ends, its relay ends too
            )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"relay exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError("relay did not become ready")

    def stop(self) -> None:
        """SIGTERM to the relay, which stops its worker (and the worker its shards); the
        relay waits for its worker up to 30 s, so wait longer than that before a kill."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def new_demo(workdir: Path) -> tuple[DemoRelay, SampleUpstream]:
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in ("data", "upstream"):
        target = workdir / stale
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=True)
    sample = build_sample_upstream(workdir / "upstream")
    return DemoRelay(workdir, free_port(), secrets.token_hex(16)), sample


def wait_for_run(base_url: str, delivery_id: str, timeout: float) -> dict[str, Any]:
    """Poll the API until the change of this delivery has all its runs finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for change in httpx.get(f"{base_url}/api/changes", timeout=10).json():
            if change["delivery_id"] == delivery_id and change["state"] == "completed":
                return dict(change)
        time.sleep(1)
    raise TimeoutError(f"no completed run for delivery {delivery_id} after {timeout:.0f}s")
