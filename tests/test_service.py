"""The relay's commands: serve's refusal without a secret, replay, settings, the embedded demo."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from ci_relay import pipeline
from ci_relay.replay import ReplayError, replay_delivery
from ci_relay.settings import Settings
from ci_relay.store.models import Change, Delivery, Run
from tests.conftest import CliResult
from tests.relay_fixtures import FIXTURES, Relay
from tests.test_intake import headers


def test_serve_refuses_to_start_without_a_webhook_secret(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    result = cli("serve", "--port", "0", env={"CI_RELAY_DATA_DIR": str(tmp_path)})
    assert result.code == 2
    assert "no webhook secret: set CI_RELAY_WEBHOOK_SECRET, or pass --local-demo" in result.stderr


def test_settings_from_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "relay.yaml"
    file.write_text(
        "database_url: sqlite:////tmp/from-file.db\nwebhook_secret: s3cr3t-value\nmax_body_bytes: 1000\n"
    )
    monkeypatch.setenv("CI_RELAY_SETTINGS_FILE", str(file))
    monkeypatch.setenv("CI_RELAY_MAX_BODY_BYTES", "2000")
    settings = Settings()
    assert settings.database_url == "sqlite:////tmp/from-file.db"
    assert settings.max_body_bytes == 2000  # the environment wins over the file
    assert settings.webhook_secret is not None and "s3cr3t-value" not in repr(settings)
    assert settings.public_dict()["webhook_secret"] == "set"
    monkeypatch.setenv("CI_RELAY_NO_SUCH_SETTING", "1")
    file.write_text("typo_setting: 1\n")
    with pytest.raises(ValueError, match="typo_setting"):
        Settings()


def test_replay_a_stored_delivery_and_a_saved_file(relay: Relay) -> None:
    body = (FIXTURES / "push/with-new-branch.payload.json").read_bytes()
    relay.client.post(
        "/webhooks/github", content=body, headers=headers("push", body, delivery="orig-1")
    )
    relay.enqueued.clear()
    pipeline.process_delivery(relay.rt, 1)
    settings = relay.rt.settings
    stored = replay_delivery(settings, "orig-1", None)
    saved = tmp_file = settings.data_dir / "saved.json"
    tmp_file.write_text(json.dumps(json.loads(body)))
    from_file = replay_delivery(settings, str(saved), "push")
    # the embedded broker holds the two queued messages
    assert len(list((settings.broker_folder / "queue").iterdir())) == 2
    for pk in (stored, from_file):
        pipeline.process_delivery(relay.rt, pk)
    with relay.rt.db.session() as s:
        replays = s.scalars(select(Delivery).where(Delivery.source == "replay")).all()
        assert [d.state for d in replays] == ["processed", "processed"]
        assert replays[0].reason == "replay of orig-1; head already tested on cpu"
        assert replays[1].reason == "replay of saved.json; head already tested on cpu"
        assert len(s.scalars(select(Change)).all()) == 3
        assert len(s.scalars(select(Run)).all()) == 1  # the same head does not run again
    with pytest.raises(ReplayError, match="needs --event"):
        replay_delivery(settings, str(saved), None)
    with pytest.raises(ReplayError, match="no stored delivery 'nope'"):
        replay_delivery(settings, "nope", None)
    hostile = json.loads(body)
    hostile["after"] = "--upload-pack=touch /tmp/x; git-upload-pack"
    tmp_file.write_text(json.dumps(hostile))
    with pytest.raises(ReplayError, match=r"saved\.json is refused: after: not a commit id"):
        replay_delivery(settings, str(saved), "push")


@pytest.mark.slow
def test_embedded_demo_shows_a_change_flowing_to_results(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    result = cli("demo", "--workdir", tmp_path / "demo", "--exit-when-done", "--timeout", "300")
    assert result.code == 0, result.output + (tmp_path / "demo" / "relay.log").read_text()[-3000:]
    assert "-> HTTP 202" in result.stdout
    assert "on cpu (L3): success" in result.stdout
    assert "on spyre-emu (L3): success" in result.stdout  # the emulated card, same change
    assert "results: http://127.0.0.1:" in result.stdout


def test_pipeline_logs_are_json_with_the_delivery_id(
    relay: Relay, capfd: pytest.CaptureFixture[str]
) -> None:
    from ci_relay.logs import configure_logging
    from ci_relay.service import tasks

    body = (FIXTURES / "pull_request/opened.payload.json").read_bytes()
    relay.client.post(
        "/webhooks/github", content=body, headers=headers("pull_request", body, delivery="log-me")
    )
    tasks.configure(relay.rt.settings)
    configure_logging()
    try:
        tasks.process_delivery.run(1)  # the task body, as a worker thread runs it
        tasks.reconcile_once()
    finally:
        import logging

        logging.getLogger().handlers.clear()
    lines = [
        json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")
    ]
    assert lines, "no JSON log lines"
    assert {line["delivery_id"] for line in lines if line["logger"].startswith("ci_relay")} >= {
        "log-me"
    }
    assert all(set(line) >= {"ts", "level", "logger", "msg", "delivery_id"} for line in lines)
    assert tasks.TASKS.labels("process", "ok")._value.get() >= 1


@pytest.mark.slow
def test_embedded_worker_never_outlives_the_api(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from ci_relay.demo import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CI_RELAY_")}
    env["CI_RELAY_DATA_DIR"] = str(tmp_path / "data")
    api = subprocess.Popen(
        [sys.executable, "-m", "ci_relay", "serve", "--port", str(port), "--local-demo"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        children: list[int] = []
        while time.monotonic() < deadline and not children:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    out = subprocess.run(
                        ["pgrep", "-P", str(api.pid)], capture_output=True, text=True
                    )
                    children = [int(p) for p in out.stdout.split()]
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert children, "the embedded worker did not start"
        api.send_signal(signal.SIGKILL)  # no cleanup code runs in the API process
        api.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{c}") for c in children):
            time.sleep(0.2)
        for child in children:
            stat = Path(f"/proc/{child}/stat")
            assert not stat.exists() or stat.read_text().split()[2] == "Z", (
                f"worker {child} outlived the API"
            )
    finally:
        if api.poll() is None:
            api.kill()
