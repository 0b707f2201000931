"""The downstream repository's workflows (``workflows/``) and the commands they call.

The workflows are linted as CI lints them (actionlint, zizmor), held to the rules a CRCR
job must follow (in_progress first, completed last and always, in one job; actions pinned
to commits; least privilege; no expression inside a script), every ``ci-relay`` command
line in them is run with ``--help`` to prove it exists with those options, and the
dispatch and spec-lint jobs are walked step by step through bash against the sample
upstream and a loopback CRCR receiver. ``report crcr`` itself is run against the same
receiver: caps, retries on 5xx and network errors, Retry-After, a stop on 4xx, OIDC.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ci_relay.reporting.job_report import (
    Envelope,
    JobIdentity,
    JobReportError,
    RetryPolicy,
    SendFailed,
    callback_body,
    conclusion,
    read_junit,
    send,
)
from ci_relay.sample_upstream import SampleUpstream
from tests.conftest import CliResult
from tests.reporting_fakes import Answer, CallbackReceiver, Fake, _json, closed_port_url

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW_DIR = ROOT / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.yml"))
ACTIONLINT_CONFIG = WORKFLOW_DIR / "actionlint.yaml"
FIXTURES = ROOT / "tests" / "data" / "github"
SHA_PIN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$")
ALLOWED_PERMISSIONS = {"contents": "read", "id-token": "write"}

Cli = Callable[..., CliResult]


def tool(name: str) -> str:
    """A linter from the dev extra, next to this Python first (where pip put it)."""
    here = Path(sysconfig.get_path("scripts")) / name
    found = str(here) if here.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]'")
    return found


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def triggers(doc: dict[Any, Any]) -> dict[str, Any]:
    """``on:`` (YAML 1.1 reads the bare key as True)."""
    on = doc.get("on", doc.get(True))
    return on if isinstance(on, dict) else {str(on): None}


def workflow(name: str) -> dict[str, Any]:
    return load(WORKFLOW_DIR / name)


def all_steps() -> Iterator[tuple[str, str, int, dict[str, Any]]]:
    for path in WORKFLOWS:
        for job_key, job in load(path)["jobs"].items():
            for index, step in enumerate(job["steps"]):
                yield path.name, job_key, index, step


def reports(job: dict[str, Any]) -> list[tuple[int, str]]:
    """(step index, status) of every ``ci-relay report crcr`` in a job."""
    found = []
    for index, step in enumerate(job["steps"]):
        for words in ci_relay_commands(step.get("run", "")):
            if words[:2] == ["report", "crcr"]:
                status = words[words.index("--status") + 1]
                found.append((index, status))
    return found


# --- lint ---------------------------------------------------------------------------------


def actionlint(
    *files: Path, config: Path | None = ACTIONLINT_CONFIG
) -> subprocess.CompletedProcess[str]:
    args = [tool("actionlint"), "-no-color"]
    if config is not None:
        args += ["-config-file", str(config)]
    return subprocess.run(
        [*args, *map(str, files)], capture_output=True, text=True, timeout=120, check=False
    )


def zizmor(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("zizmor"), "--offline", "--no-progress", "--color=never", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_there_are_the_three_workflows() -> None:
    assert [p.name for p in WORKFLOWS] == [
        "crcr-dispatch.yml",
        "nightly.yml",
        "reuse-spec-lint.yml",
    ]


def test_actionlint_finds_nothing() -> None:
    result = actionlint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_actionlint_flags_a_broken_copy(tmp_path: Path) -> None:
    text = (WORKFLOW_DIR / "crcr-dispatch.yml").read_text()
    broken = tmp_path / "broken.yml"
    broken.write_text(
        text.replace("steps.start.outputs.started_at", "steps.nope.outputs.started_at")
    )
    result = actionlint(broken)
    assert result.returncode == 1 and "nope" in result.stdout, result.stdout
    # and the self-hosted label is only known through our config
    result = actionlint(WORKFLOW_DIR / "crcr-dispatch.yml", config=None)
    assert result.returncode == 1 and 'label "spyre" is unknown' in result.stdout


def test_zizmor_finds_nothing() -> None:
    result = zizmor(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings" in result.stdout + result.stderr


def test_zizmor_flags_an_injectable_copy(tmp_path: Path) -> None:
    text = (WORKFLOW_DIR / "crcr-dispatch.yml").read_text()
    injected = text.replace(
        'run: ci-relay dispatch-info --repository "$UPSTREAM_REPO"',
        'run: echo "${{ github.event.client_payload.payload.pull_request.title }}"',
    )
    unpinned = re.sub(r"actions/checkout@[0-9a-f]{40}", "someone/checkout@main", injected)
    assert unpinned != text
    path = tmp_path / "injectable.yml"
    path.write_text(unpinned)
    result = zizmor(path)
    assert result.returncode != 0
    assert "template-injection" in result.stdout and "unpinned-uses" in result.stdout


# --- the rules ----------------------------------------------------------------------------


def test_permissions_are_declared_and_least() -> None:
    for path in WORKFLOWS:
        doc = load(path)
        assert doc.get("permissions") == {}, f"{path.name}: top-level permissions: {{}}"
        for key, job in doc["jobs"].items():
            granted = job.get("permissions")
            assert isinstance(granted, dict), f"{path.name}/{key} declares no permissions"
            for scope, level in granted.items():
                assert ALLOWED_PERMISSIONS.get(scope) == level, f"{path.name}/{key}: {scope}"


def test_every_action_is_pinned_to_a_commit() -> None:
    uses = [(name, step) for name, _, _, step in all_steps() if "uses" in step]
    assert uses
    for name, step in uses:
        assert SHA_PIN.match(step["uses"]), f"{name}: {step['uses']} is not pinned to a sha"
        if step["uses"].startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False, f"{name}: {step.get('name')}"
    for path in WORKFLOWS:  # and the release it is, for whoever bumps it
        for line in path.read_text().splitlines():
            if "uses:" in line:
                assert re.search(r"@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), f"{path.name}: {line}"


def test_no_expression_is_pasted_into_a_script() -> None:
    for name, job, index, step in all_steps():
        assert "${{" not in step.get("run", ""), f"{name}/{job} step {index}: use env"


def test_secrets_reach_only_the_report_steps() -> None:
    for path in WORKFLOWS:
        doc = load(path)
        assert "secrets." not in json.dumps(doc.get("env", {}))
        for key, job in doc["jobs"].items():
            assert "secrets." not in json.dumps(job.get("env", {})), f"{path.name}/{key}"
            for step in job["steps"]:
                if "secrets." in json.dumps(step.get("env", {})):
                    assert "ci-relay report crcr" in step["run"], step.get("name")


def test_crcr_reports_open_and_close_their_job() -> None:
    seen = 0
    for path in WORKFLOWS:
        for key, job in load(path)["jobs"].items():
            found = reports(job)
            if not found:
                continue
            seen += 1
            statuses = [status for _, status in found]
            last = len(job["steps"]) - 1
            assert statuses.count("completed") == 1, f"{path.name}/{key}"
            assert found[-1] == (last, "completed"), f"{path.name}/{key}: completed is last"
            assert "always()" in job["steps"][last]["if"], f"{path.name}/{key}"
            if "in_progress" in statuses:
                assert found[0] == (0, "in_progress"), f"{path.name}/{key}: in_progress first"
    assert seen == 2  # the dispatch job and the nightly


def test_the_dispatch_workflow() -> None:
    doc = workflow("crcr-dispatch.yml")
    assert set(triggers(doc)) == {"repository_dispatch"}
    assert "pull_request" in triggers(doc)["repository_dispatch"]["types"]
    assert "head.sha" in doc["concurrency"]["group"]
    (job,) = doc["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "spyre"]
    assert [status for _, status in reports(job)] == ["in_progress", "completed"]
    commands = [
        words[0] for step in job["steps"] for words in ci_relay_commands(step.get("run", ""))
    ]
    assert commands == ["report", "dispatch-info", "select", "run", "report"]
    upload = next(
        s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")
    )
    assert "always()" in upload["if"]


def test_the_spec_lint_workflow() -> None:
    doc = workflow("reuse-spec-lint.yml")
    assert triggers(doc) == {"pull_request": {"paths": ["reuse_specs/**"]}}
    (job,) = doc["jobs"].values()
    words = [w for step in job["steps"] for w in ci_relay_commands(step.get("run", ""))]
    assert words == [["specs", "check", "--upstream", "upstream", "${specs[@]}"]]


def test_the_nightly_workflow() -> None:
    doc = workflow("nightly.yml")
    on = triggers(doc)
    assert set(on) == {"schedule", "workflow_dispatch"}
    assert len(on["schedule"][0]["cron"].split()) == 5
    (job,) = doc["jobs"].values()
    runs = [
        w for step in job["steps"] for w in ci_relay_commands(step.get("run", "")) if w[0] == "run"
    ]
    assert len(runs) == 1 and "--tests" not in runs[0]  # no selection: every covered test


# --- every ci-relay command line exists ---------------------------------------------------

SHELL_ENDS = {">", ">>", "|", "||", "&&", ";", "2>&1", "&"}


def ci_relay_commands(script: str) -> list[list[str]]:
    """The words after ``ci-relay`` of each command line in a shell script."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("#") or not re.search(r"(^|[\s;&|(])ci-relay\s", line):
            continue
        words = shlex.split(line[line.index("ci-relay") :], comments=True)
        end = next((i for i, w in enumerate(words) if w in SHELL_ENDS), len(words))
        found.append(words[1:end])
    return found


def help_text(words: tuple[str, ...]) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.run(
        [sys.executable, "-m", "ci_relay", *words, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def command_problems(scripts: list[str]) -> list[str]:
    """Commands that do not exist, and options they do not have."""
    wanted: dict[tuple[str, ...], set[str]] = {}
    for script in scripts:
        for words in ci_relay_commands(script):
            path = tuple(w for w in words[:2] if re.fullmatch(r"[a-z][a-z-]*", w))
            flags = {w.split("=", 1)[0] for w in words if w.startswith("--")}
            wanted.setdefault(path, set()).update(flags)
    problems = []
    for path, flags in sorted(wanted.items()):
        code, text = help_text(path)
        if code != 0:
            problems.append(f"ci-relay {' '.join(path)}: exit {code}")
            continue
        problems += [
            f"ci-relay {' '.join(path)} has no {flag}"
            for flag in sorted(flags)
            if not re.search(rf"{re.escape(flag)}(?![\w-])", text)
        ]
    return problems


def test_every_ci_relay_command_the_workflows_run_exists() -> None:
    scripts = [step.get("run", "") for _, _, _, step in all_steps()]
    assert sum(len(ci_relay_commands(s)) for s in scripts) == 8
    assert command_problems(scripts) == []


def test_the_command_check_can_fail() -> None:
    assert command_problems(
        ["ci-relay report crcr --status x --no-such-flag", "ci-relay no-such-command --x"]
    ) == [
        "ci-relay no-such-command: exit 2",
        "ci-relay report crcr has no --no-such-flag",
    ]


# --- report crcr against a loopback CRCR receiver -----------------------------------------


@pytest.fixture
def receiver() -> Iterator[tuple[CallbackReceiver, str]]:
    fake = CallbackReceiver(token="s3cret")
    with fake.running() as url:
        yield fake, f"{url}/github/callback/"


def dispatch_event(
    tmp_path: Path,
    payload_file: str = "pull_request/synchronize.payload.json",
    event_type: str = "pull_request",
    **changes: Any,
) -> Path:
    """A repository_dispatch event as the downstream job gets it, around a real webhook."""
    event = json.loads((FIXTURES / "repository_dispatch" / "payload.json").read_text())
    payload = json.loads((FIXTURES / payload_file).read_text())
    for dotted, value in changes.items():
        target = payload
        *parents, leaf = dotted.split("__")
        for part in parents:
            target = target[part]
        target[leaf] = value
    event["action"] = event_type
    event["client_payload"] = {
        "event_type": event_type,
        "delivery_id": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "payload": payload,
    }
    path = tmp_path / f"event-{len(list(tmp_path.glob('event-*')))}.json"
    path.write_text(json.dumps(event))
    return path


def actions_env(tmp_path: Path, event: Path | None = None, **extra: str) -> dict[str, str]:
    """What a GitHub Actions job's environment gives the command (and nothing of ours)."""
    env = {
        "GITHUB_EVENT_PATH": str(event or dispatch_event(tmp_path)),
        "GITHUB_WORKFLOW": "crcr",
        "GITHUB_JOB": "test",
        "GITHUB_RUN_ID": "4242",
        "GITHUB_RUN_ATTEMPT": "2",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "ibm/torch-spyre",
        "GITHUB_OUTPUT": str(tmp_path / "github-output.txt"),
        "CRCR_TOKEN": "s3cret",
        "ACTIONS_ID_TOKEN_REQUEST_URL": "",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "",
    }
    env.update(extra)
    return env


def outputs(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(line.split("=", 1) for line in lines)


def write_junit(
    path: Path,
    passed: int = 0,
    failed: int = 0,
    skipped: int = 0,
    xfailed: int = 0,
    message: str = "AssertionError: 1 != 2",
    text: str = "Traceback\nAssertionError",
) -> Path:
    """A pytest-shaped JUnit file (xunit2: dotted class names, no file attribute)."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="pytest")

    def case(name: str) -> ET.Element:
        return ET.SubElement(suite, "testcase", classname="test.test_ops.TestOpsSPYRE", name=name)

    for i in range(passed):
        case(f"test_ok_{i}")
    for i in range(failed):
        ET.SubElement(case(f"test_bad_{i}"), "failure", message=message).text = text
    for i in range(skipped):
        ET.SubElement(case(f"test_skip_{i}"), "skipped", type="pytest.skip", message="no card")
    for i in range(xfailed):
        ET.SubElement(case(f"test_xf_{i}"), "skipped", type="pytest.xfail", message="expected")
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


def test_in_progress_then_completed_reach_the_receiver(
    cli: Cli, receiver: tuple[CallbackReceiver, str], tmp_path: Path
) -> None:
    fake, url = receiver
    env = actions_env(tmp_path)
    common = ["report", "crcr", "--callback-url", url, "--token-env", "CRCR_TOKEN"]
    started = cli(*common, "--status", "in_progress", "--check-run-id", "99", env=env)
    assert started.code == 0, started.output
    started_at = outputs(Path(env["GITHUB_OUTPUT"]))["started_at"]
    junit = write_junit(tmp_path / "junit.xml", passed=5, failed=2, skipped=3, xfailed=1)
    done = cli(
        *common,
        "--status",
        "completed",
        "--check-run-id",
        "99",
        "--junit",
        junit,
        "--started-at",
        started_at,
        "--artifact-url",
        "https://github.com/ibm/torch-spyre/actions/runs/4242/artifacts/1",
        env=env,
    )
    assert done.code == 0, done.output
    assert "CRCR completed sent: HTTP 200" in done.stdout
    first, second = fake.accepted
    sent = json.loads((FIXTURES / "pull_request" / "synchronize.payload.json").read_text())
    for body in (first, second):  # the dispatch goes back as it came
        assert body["event_type"] == "pull_request"
        assert body["delivery_id"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
        assert body["payload"] == sent
    assert first["workflow"] | {"started_at": None} == {
        "schema_version": "1",
        "status": "in_progress",
        "conclusion": None,
        "name": "crcr",
        "url": "https://github.com/ibm/torch-spyre/actions/runs/4242",
        "run_id": 4242,
        "run_attempt": 2,
        "job_name": "test",
        "check_run_id": 99,
        "started_at": None,
        "completed_at": None,
        "test_results": None,
        "artifact_url": None,
        "failed_tests": [],
        "failed_tests_omitted": 0,
        "triage_verdict": None,
    }
    wf = second["workflow"]
    assert wf["status"] == "completed" and wf["conclusion"] == "failure"  # 2 tests failed
    assert wf["started_at"] == first["workflow"]["started_at"]
    assert datetime.fromisoformat(wf["completed_at"]) >= datetime.fromisoformat(wf["started_at"])
    assert wf["test_results"] == {"passed": 6, "failed": 2, "skipped": 3, "total": 11}
    assert wf["artifact_url"].endswith("/artifacts/1")
    assert [t["name"] for t in wf["failed_tests"]] == [
        "test/test_ops.py::TestOpsSPYRE::test_bad_0",
        "test/test_ops.py::TestOpsSPYRE::test_bad_1",
    ]
    assert wf["failed_tests"][0] | {"name": None} == {
        "name": None,
        "file": "test/test_ops.py",
        "outcome": "failed",
        "message": "AssertionError: 1 != 2",
        "stacktrace": "Traceback\nAssertionError",
    }
    for seen in fake.posts():
        assert seen.headers["authorization"] == "Bearer s3cret"


def test_ten_thousand_failures_are_cut_to_the_format(
    cli: Cli, receiver: tuple[CallbackReceiver, str], tmp_path: Path
) -> None:
    fake, url = receiver
    junit = tmp_path / "junit.xml"
    suite = ET.Element("testsuite", name="pytest")
    for i in range(10_000):
        case = ET.SubElement(
            suite, "testcase", classname="test.test_ops.TestOpsSPYRE", name=f"test_{i}"
        )
        long = i < 1200  # what the body can show is long; the rest short, to keep the file small
        failure = ET.SubElement(case, "failure", message=f"E{i} " + "é" * (1500 if long else 1))
        failure.text = "Traceback\n" + "x" * (6000 if long else 10)
    wrapper = ET.Element("testsuites")
    wrapper.append(suite)
    ET.ElementTree(wrapper).write(junit, encoding="utf-8")
    result = cli(
        "report",
        "crcr",
        "--status",
        "completed",
        "--junit",
        junit,
        "--callback-url",
        url,
        "--token-env",
        "CRCR_TOKEN",
        "--output",
        tmp_path / "body.json",
        env=actions_env(tmp_path),
    )
    assert result.code == 0, result.output
    (body,) = fake.accepted  # the receiver checks the caps itself, independently of our models
    assert len((tmp_path / "body.json").read_bytes()) <= 2_000_000
    assert (tmp_path / "body.json").read_bytes() == fake.posts()[0].body
    wf = body["workflow"]
    assert wf["conclusion"] == "failure"
    assert wf["test_results"] == {"passed": 0, "failed": 10_000, "skipped": 0, "total": 10_000}
    assert len(wf["failed_tests"]) == 1000 and wf["failed_tests_omitted"] == 9000
    assert wf["failed_tests"][999]["name"].endswith("::test_999")
    for entry in wf["failed_tests"]:
        assert len(entry["message"].encode()) <= 1024 and entry["message"].endswith("…[truncated]")
        assert entry.get("stacktrace") is None or len(entry["stacktrace"].encode()) <= 4096


def test_a_stacktrace_is_cut_to_4_kb_and_a_message_to_1_kb(tmp_path: Path) -> None:
    junit = write_junit(
        tmp_path / "j.xml", failed=3, message="m" * 3000, text="Traceback\n" + "s" * 10_000
    )
    summary = read_junit([junit])
    body = json.loads(
        callback_body(
            Envelope("pull_request", "d1", {}),
            JobIdentity("crcr", "test", "1"),
            "completed",
            started_at=datetime.now(UTC),
            summary=summary,
        )
    )
    for entry in body["workflow"]["failed_tests"]:
        assert 3500 < len(entry["stacktrace"].encode()) <= 4096
        assert 1000 < len(entry["message"].encode()) <= 1024


def test_a_500_is_retried_until_it_is_taken(
    cli: Cli, receiver: tuple[CallbackReceiver, str], tmp_path: Path
) -> None:
    fake, url = receiver
    fake.script(500, times=2)
    result = cli(
        "report",
        "crcr",
        "--status",
        "in_progress",
        "--callback-url",
        url,
        "--token-env",
        "CRCR_TOKEN",
        "--backoff",
        "0",
        env=actions_env(tmp_path),
    )
    assert result.code == 0, result.output
    assert len(fake.posts()) == 3 and len(fake.accepted) == 1
    assert result.stderr.count("retrying in") == 2 and "HTTP 500" in result.stderr


def test_retry_after_is_honoured_up_to_max_wait(receiver: tuple[CallbackReceiver, str]) -> None:
    fake, url = receiver
    fake.script(503, {"retry-after": "2"})
    fake.script(429, {"retry-after": "3600"})
    slept: list[float] = []
    headers = {"content-type": "application/json", "authorization": "Bearer s3cret"}
    with pytest.raises(SendFailed) as caught:  # then the fake's verdict on "{}": 422, final
        send(
            "POST",
            url,
            content=b"{}",
            headers=headers,
            policy=RetryPolicy(backoff=0, max_wait=5),
            sleep=slept.append,
        )
    assert caught.value.refused and caught.value.attempts == 3 and "HTTP 422" in caught.value.reason
    assert len(slept) == 2 and 1.5 < slept[0] <= 2.0 and slept[1] == 5.0


def test_a_4xx_stops_at_once_with_the_answer(
    cli: Cli, receiver: tuple[CallbackReceiver, str], tmp_path: Path
) -> None:
    fake, url = receiver
    result = cli(
        "report",
        "crcr",
        "--status",
        "in_progress",
        "--callback-url",
        url,
        "--token-env",
        "CRCR_TOKEN",
        env=actions_env(tmp_path, CRCR_TOKEN="wrong"),
    )
    assert result.code == 1, result.output
    assert len(fake.posts()) == 1
    assert (
        "refused the report: HTTP 401 from POST" in result.stderr
        and "bad credentials" in result.stderr
    )


def test_an_unreachable_callback_gives_up_clearly(cli: Cli, tmp_path: Path) -> None:
    result = cli(
        "report",
        "crcr",
        "--status",
        "in_progress",
        "--callback-url",
        closed_port_url(),
        "--attempts",
        "2",
        "--backoff",
        "0",
        env=actions_env(tmp_path),
    )
    assert result.code == 3, result.output
    assert "could not be reached: gave up after 2 attempts: ConnectError" in result.stderr


class TokenIssuer(Fake):
    """GitHub's OIDC token endpoint: a bearer request token in, ``{"value": jwt}`` out."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        if headers.get("authorization") != "Bearer request-token":
            return _json(401, {"message": "bad request token"})
        return _json(200, {"count": 1, "value": "oidc-jwt"})


def test_without_a_token_the_callback_gets_an_oidc_token(cli: Cli, tmp_path: Path) -> None:
    issuer, fake = TokenIssuer(), CallbackReceiver(token="oidc-jwt")
    issuer.script(502)  # minting is retried too
    with issuer.running() as token_url, fake.running() as url:
        env = actions_env(
            tmp_path,
            CRCR_TOKEN="",
            ACTIONS_ID_TOKEN_REQUEST_URL=f"{token_url}/token?api-version=2.0",
            ACTIONS_ID_TOKEN_REQUEST_TOKEN="request-token",
        )
        result = cli(
            "report",
            "crcr",
            "--status",
            "in_progress",
            "--callback-url",
            url,
            "--token-env",
            "CRCR_TOKEN",
            "--oidc",
            "--backoff",
            "0",
            env=env,
        )
    assert result.code == 0, result.output
    assert len(fake.accepted) == 1
    assert issuer.seen[-1].path == "/token?api-version=2.0&audience=pytorch-cross-repo-ci-relay"


def test_oidc_needs_the_id_token_permission(cli: Cli, tmp_path: Path) -> None:
    result = cli(
        "report",
        "crcr",
        "--status",
        "in_progress",
        "--callback-url",
        "http://127.0.0.1:9/x",
        "--oidc",
        env=actions_env(tmp_path),
    )
    assert result.code == 2 and "id-token: write" in result.stderr


def test_a_dispatch_that_is_not_crcr_is_refused(cli: Cli, tmp_path: Path) -> None:
    plain = FIXTURES / "repository_dispatch" / "payload.json"  # client_payload of another tool
    result = cli(
        "report",
        "crcr",
        "--status",
        "in_progress",
        "--dry-run",
        env=actions_env(tmp_path, GITHUB_EVENT_PATH=str(plain)),
    )
    assert result.code == 2
    assert "not a CRCR dispatch (client_payload.event_type: Field required)" in result.stderr


def test_a_nightly_report_needs_no_dispatch(cli: Cli, tmp_path: Path) -> None:
    junit = write_junit(tmp_path / "junit.xml", passed=2)
    result = cli(
        "report",
        "crcr",
        "--status",
        "completed",
        "--event-type",
        "nightly",
        "--delivery-id",
        "a" * 40,
        "--junit",
        junit,
        "--junit",
        tmp_path / "missing.xml",
        "--dry-run",
        env=actions_env(tmp_path, GITHUB_EVENT_PATH=""),
    )
    assert result.code == 0, result.output
    body = json.loads(result.stdout)
    assert (body["event_type"], body["delivery_id"], body["payload"]) == ("nightly", "a" * 40, {})
    assert body["workflow"]["conclusion"] == "success"
    assert body["workflow"]["test_results"]["total"] == 2
    assert "no JUnit at" in result.stderr


def test_a_report_outside_the_format_is_bad_input(cli: Cli, tmp_path: Path) -> None:
    env = actions_env(tmp_path, GITHUB_JOB="j" * 300)
    result = cli("report", "crcr", "--status", "in_progress", "--dry-run", env=env)
    assert result.code == 2
    assert "breaks the CRCR format at job_name: String should have at most 256" in result.stderr
    result = cli("report", "crcr", "--status", "done", "--dry-run", env=actions_env(tmp_path))
    assert result.code == 2 and "use in_progress or completed" in result.stderr


# --- dispatch-info ------------------------------------------------------------------------


def test_dispatch_info_reads_a_pull_request(cli: Cli, tmp_path: Path) -> None:
    env = actions_env(tmp_path)
    result = cli("dispatch-info", "--repository", "codertocat/hello-world", env=env)
    assert result.code == 0, result.output
    expected = {
        "event_type": "pull_request",
        "delivery_id": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "repository": "Codertocat/Hello-World",
        "kind": "pull_request",
        "head_sha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
        "base": "f95f852bd8fca8fcc58a9a2d6c842781e32a215e",
        "number": "2",
        "runs_tests": "true",
        "reason": "",
    }
    assert outputs(Path(env["GITHUB_OUTPUT"])) == expected
    assert result.stdout.splitlines() == [f"{k}={v}" for k, v in expected.items()]


def test_dispatch_info_on_a_new_branch_compares_with_the_parent(cli: Cli, tmp_path: Path) -> None:
    event = dispatch_event(tmp_path, "push/with-new-branch.payload.json", "push")
    result = cli("dispatch-info", env=actions_env(tmp_path, event))
    assert result.code == 0, result.output
    assert "base=6113728f27ae82c7b1a177c8d03f9e96e0adf246^" in result.stdout.splitlines()


def test_dispatch_info_says_when_nothing_runs(cli: Cli, tmp_path: Path) -> None:
    event = dispatch_event(tmp_path, "pull_request/closed.payload.json")
    result = cli("dispatch-info", env=actions_env(tmp_path, event))
    assert result.code == 0, result.output
    assert "runs_tests=false" in result.stdout.splitlines()


@pytest.mark.parametrize(
    ("changes", "option", "message"),
    [
        (
            {"pull_request__head__sha": "ec26c3e\nrepository=evil/repo"},
            (),
            "payload field pull_request.head.sha: not a commit id",
        ),
        ({}, ("--repository", "pytorch/pytorch"), "not 'pytorch/pytorch'"),
    ],
)
def test_dispatch_info_refuses_what_a_job_must_not_use(
    cli: Cli, tmp_path: Path, changes: dict[str, str], option: tuple[str, ...], message: str
) -> None:
    event = dispatch_event(tmp_path, **changes)
    env = actions_env(tmp_path, event)
    result = cli("dispatch-info", *option, env=env)
    assert result.code == 2 and message in result.stderr, result.output
    assert outputs(Path(env["GITHUB_OUTPUT"])) == {}


# --- pure parts ---------------------------------------------------------------------------


def test_junit_cases_read_as_pytest_node_ids(tmp_path: Path) -> None:
    path = tmp_path / "mixed.xml"
    path.write_text(
        """<testsuites><testsuite>
        <testcase classname="test.test_ops.TestOpsSPYRE" name="test_a"><failure message="boom">tb</failure></testcase>
        <testcase classname="test.test_ops.py.TestOps" name="test_b"><error message="crash" type="crashed"/></testcase>
        <testcase classname="test.nn.test_conv.TestConv" file="test/nn/test_conv.py" name="test_c"><failure/></testcase>
        <testcase classname="test.test_misc" name="test_d"><failure message="m"/></testcase>
        <testcase classname="test.test_misc" name="test_e"><skipped type="pytest.xfail"/></testcase>
        </testsuite></testsuites>"""
    )
    summary = read_junit([path])
    assert [(c.nodeid, c.file, c.outcome) for c in summary.failures] == [
        ("test/test_ops.py::TestOpsSPYRE::test_a", "test/test_ops.py", "failed"),
        ("test/test_ops.py::TestOps::test_b", "test/test_ops.py", "crashed"),
        ("test/nn/test_conv.py::TestConv::test_c", "test/nn/test_conv.py", "failed"),
        ("test/test_misc.py::test_d", "test/test_misc.py", "failed"),
    ]
    assert (summary.passed, summary.failed, summary.total) == (1, 4, 5)
    with pytest.raises(JobReportError, match="not a readable JUnit"):
        read_junit([tmp_path / "nope.xml"])


def test_the_conclusion_follows_the_job_and_the_tests() -> None:
    failing = read_junit([])
    failing.failed = 1
    assert conclusion("success", failing) == "failure"
    assert conclusion("cancelled", failing) == "cancelled"
    assert conclusion("SUCCESS", read_junit([])) == "success"
    with pytest.raises(JobReportError):
        conclusion("great", None)


def test_send_reports_a_refusal_without_retrying(receiver: tuple[CallbackReceiver, str]) -> None:
    fake, url = receiver
    with pytest.raises(SendFailed) as caught:
        send("POST", url, content=b"{}", policy=RetryPolicy(backoff=0), sleep=lambda _s: None)
    assert len(fake.posts()) == 1
    assert caught.value.refused and caught.value.attempts == 1 and "HTTP 401" in caught.value.reason


# --- walking the jobs through bash --------------------------------------------------------


class Expression:
    """The part of GitHub's expression language our workflows use."""

    TOKEN = re.compile(r"\s*(\|\||&&|==|!=|\(|\)|'(?:[^']|'')*'|[A-Za-z_][\w.-]*(?:\(\))?)")

    def __init__(self, text: str, contexts: dict[str, Any]) -> None:
        self.tokens: list[str] = self.TOKEN.findall(text)
        assert "".join(self.tokens) == re.sub(r"\s", "", text), f"unsupported: {text}"
        self.contexts = contexts

    def value(self) -> Any:
        result = self._or()
        assert not self.tokens, self.tokens
        return result

    def _take(self, *wanted: str) -> str | None:
        if self.tokens and self.tokens[0] in wanted:
            return self.tokens.pop(0)
        return None

    def _or(self) -> Any:
        left = self._and()
        while self._take("||"):
            right = self._and()
            left = left if left else right
        return left

    def _and(self) -> Any:
        left = self._compare()
        while self._take("&&"):
            right = self._compare()
            left = right if left else left
        return left

    def _compare(self) -> Any:
        left = self._atom()
        op = self._take("==", "!=")
        if op is None:
            return left
        right = self._atom()
        same = str(left or "").lower() == str(right or "").lower()
        return same if op == "==" else not same

    def _atom(self) -> Any:
        token = self.tokens.pop(0)
        if token == "(":
            inner = self._or()
            assert self._take(")")
            return inner
        if token.startswith("'"):
            return token[1:-1].replace("''", "'")
        if token.endswith("()"):
            return {"always()": True, "success()": self.contexts["job"]["status"] == "success"}[
                token
            ]
        value: Any = self.contexts
        for part in token.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value


def render(text: str, contexts: dict[str, Any]) -> str:
    def one(match: re.Match[str]) -> str:
        value = Expression(match.group(1), contexts).value()
        return (
            "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        )

    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


@dataclass
class Walk:
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)


def walk(
    job: dict[str, Any],
    workspace: Path,
    contexts: dict[str, Any],
    env: dict[str, str],
    uses: dict[str, dict[str, str]],
) -> Walk:
    """Run a job's steps as a runner would: ``if:``, env, bash -e, $GITHUB_OUTPUT, job.status;
    a ``uses:`` step is stood in for (keyed by action name) by the outputs given."""
    contexts["job"]["status"] = "success"
    contexts["steps"] = {}
    result = Walk()
    for index, step in enumerate(job["steps"]):
        name = step.get("name", str(index))
        condition = str(step.get("if", "")).strip()
        if not re.search(r"\b(always|success|failure|cancelled)\(\)", condition):
            condition = f"success() && ({condition})" if condition else "success()"
        if not Expression(condition, contexts).value():
            contexts["steps"][step.get("id", name)] = {"outcome": "skipped", "outputs": {}}
            continue
        result.ran.append(name)
        if "uses" in step:
            action = step["uses"].split("@")[0]
            contexts["steps"][step.get("id", name)] = {
                "outcome": "success",
                "outputs": uses[action],
            }
            continue
        output = workspace.parent / f"output-{index}.txt"
        output.write_text("")
        step_env = {**env, "GITHUB_OUTPUT": str(output)}
        for key, value in {**job.get("env", {}), **step.get("env", {})}.items():
            step_env[key] = render(str(value), contexts)
        script = workspace.parent / f"step-{index}.sh"
        script.write_text(step["run"])
        proc = subprocess.run(
            ["bash", "-e", str(script)],
            cwd=workspace,
            env=step_env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        result.logs[name] = proc.stdout + proc.stderr
        outcome = "success" if proc.returncode == 0 else "failure"
        contexts["steps"][step.get("id", name)] = {"outcome": outcome, "outputs": outputs(output)}
        if outcome == "failure" and not step.get("continue-on-error"):
            contexts["job"]["status"] = "failure"
    return result


@pytest.fixture
def runner(tmp_path: Path) -> dict[str, str]:
    """A runner's environment: ``ci-relay`` on PATH is this checkout, RUNNER_TEMP is fresh."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ci-relay"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ci_relay "$@"\n')
    shim.chmod(0o755)
    (tmp_path / "runner-temp").mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "ACTIONS_", "CI_RELAY_", "TORCH_ROOT"))
    }
    env.update(
        {
            "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
            "RUNNER_TEMP": str(tmp_path / "runner-temp"),
            "COLUMNS": "200",
            "GITHUB_WORKFLOW": "crcr",
            "GITHUB_JOB": "test",
            "GITHUB_RUN_ID": "31337",
            "GITHUB_RUN_ATTEMPT": "1",
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_REPOSITORY": "ibm/torch-spyre",
        }
    )
    return env


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.slow
def test_the_dispatch_job_walked_on_the_sample_upstream(
    tmp_path: Path, runner: dict[str, str], sample_upstream: SampleUpstream
) -> None:
    """A change that breaks a must-pass test: selected, run, failed; results uploaded and
    completed reported all the same (``if: always()``), with the failure in it."""
    head, base = sample_upstream.commits[-2].sha, sample_upstream.commits[-3].sha  # floor_divide
    workspace = tmp_path / "workspace"
    specs = workspace / "downstream" / "reuse_specs"
    specs.mkdir(parents=True)
    for spec in (ROOT / "reuse_specs" / "specs").glob("*.yaml"):
        (specs / spec.name).write_text(spec.read_text())
    binary = specs / "spyre_binary_ufuncs.yaml"
    strict = "names: [TestBinaryUfuncs::test_floor_divide_rounds_toward_zero]\n          mode: xfail_strict"
    assert strict in binary.read_text()  # the bundled spec expects the upstream bug; not here
    binary.write_text(
        binary.read_text().replace(strict, strict.replace("xfail_strict", "mandatory_success"))
    )
    subprocess.run(
        ["git", "clone", "-q", str(sample_upstream.path), str(workspace / "upstream")], check=True
    )
    git(workspace / "upstream", "checkout", "-q", head)  # what the upstream checkout step does
    event = dispatch_event(
        tmp_path,
        pull_request__head__sha=head,
        pull_request__base__sha=base,
        repository__full_name="pytorch/pytorch",
    )
    fake = CallbackReceiver(token="s3cret")
    job = workflow("crcr-dispatch.yml")["jobs"]["test"]
    with fake.running() as url:
        contexts: dict[str, Any] = {
            "vars": {
                "CRCR_CALLBACK_URL": f"{url}/callback",
                "CI_RELAY_BACKEND": "cpu",
                "CI_RELAY_RUNTIME": "local",
            },
            "secrets": {"CRCR_CALLBACK_TOKEN": "s3cret"},
            "job": {"check_run_id": "5550001"},
            "runner": {"temp": runner["RUNNER_TEMP"]},
            "github": {"run_attempt": "1"},
        }
        uploaded = {
            "artifact-url": "https://github.com/ibm/torch-spyre/actions/runs/31337/artifacts/9"
        }
        result = walk(
            job,
            workspace,
            contexts,
            {**runner, "GITHUB_EVENT_PATH": str(event)},
            {"actions/checkout": {}, "actions/upload-artifact": uploaded},
        )
    logs = "\n".join(f"== {k}\n{v}" for k, v in result.logs.items())
    assert [contexts["steps"][k]["outcome"] for k in ("start", "change", "select")] == [
        "success"
    ] * 3, logs
    assert contexts["steps"]["Run them"]["outcome"] == "failure", logs
    assert result.ran[-2:] == ["Upload the results", "Report completed to CRCR"]
    assert contexts["steps"]["Report completed to CRCR"]["outcome"] == "success", logs
    first, last = fake.accepted
    assert (
        first["workflow"]["status"] == "in_progress" and last["workflow"]["status"] == "completed"
    )
    wf = last["workflow"]
    assert (wf["conclusion"], wf["check_run_id"], wf["run_id"]) == ("failure", 5550001, 31337)
    assert wf["started_at"] == first["workflow"]["started_at"]
    assert wf["artifact_url"] == uploaded["artifact-url"]
    assert (
        wf["test_results"]["failed"] >= 1
        and wf["test_results"]["total"] > wf["test_results"]["failed"]
    )
    assert any("test_floor_divide_rounds_toward_zero" in t["name"] for t in wf["failed_tests"])
    plan = json.loads((Path(runner["RUNNER_TEMP"]) / "crcr" / "plan.json").read_text())
    assert (plan["base"], plan["head"]) == (base, head)


def test_the_dispatch_job_on_a_closed_pull_request_reports_skipped(
    tmp_path: Path, runner: dict[str, str]
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    event = dispatch_event(
        tmp_path, "pull_request/closed.payload.json", repository__full_name="pytorch/pytorch"
    )
    fake = CallbackReceiver(token="s3cret")
    with fake.running() as url:
        contexts: dict[str, Any] = {
            "vars": {"CRCR_CALLBACK_URL": url},
            "secrets": {"CRCR_CALLBACK_TOKEN": "s3cret"},
            "job": {"check_run_id": "1"},
            "runner": {"temp": runner["RUNNER_TEMP"]},
            "github": {"run_attempt": "1"},
        }
        result = walk(
            workflow("crcr-dispatch.yml")["jobs"]["test"],
            workspace,
            contexts,
            {**runner, "GITHUB_EVENT_PATH": str(event)},
            {},
        )
    assert result.ran == [
        "Report in_progress to CRCR",
        "Read the dispatched change",
        "Report completed to CRCR",
    ], result.logs
    assert [b["workflow"]["status"] for b in fake.accepted] == ["in_progress", "completed"]
    assert fake.accepted[1]["workflow"]["conclusion"] == "skipped"
    assert fake.accepted[1]["workflow"]["test_results"]["total"] == 0


def test_the_spec_lint_job_walked_on_a_pull_request(
    tmp_path: Path, runner: dict[str, str], sample_upstream: SampleUpstream
) -> None:
    """Only the specs the pull request changed are checked; errors become annotations."""
    repo = tmp_path / "workspace"
    (repo / "reuse_specs").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "ci@example.invalid")
    git(repo, "config", "user.name", "ci")
    bundled = ROOT / "reuse_specs" / "specs" / "spyre_view_ops.yaml"
    (repo / "reuse_specs" / "untouched.yaml").write_text(
        "test_suite_config: {bogus: 1}\n"
    )  # broken, not changed
    (repo / "reuse_specs" / "view_ops.yaml").write_text(bundled.read_text())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "reuse_specs" / "view_ops.yaml").write_text(
        bundled.read_text().replace("mode: xfail", "mode: sometimes", 1)
    )
    git(repo, "commit", "-q", "-am", "head")
    head = git(repo, "rev-parse", "HEAD")
    subprocess.run(
        ["git", "clone", "-q", str(sample_upstream.path), str(repo / "upstream")], check=True
    )
    job = workflow("reuse-spec-lint.yml")["jobs"]["specs-check"]
    contexts: dict[str, Any] = {
        "job": {},
        "vars": {},
        "github": {"event": {"pull_request": {"base": {"sha": base}, "head": {"sha": head}}}},
    }
    uses: dict[str, dict[str, str]] = {"actions/checkout": {}, "actions/setup-python": {}}
    job["steps"] = [
        s for s in job["steps"] if s.get("name") != "Install ci-relay"
    ]  # it is installed
    result = walk(job, repo, contexts, runner, uses)
    log = result.logs["Check the changed specs"]
    assert contexts["steps"]["Check the changed specs"]["outcome"] == "failure", log
    assert "checking reuse_specs/view_ops.yaml" in log and "untouched" not in log
    assert re.search(
        r"^::error file=reuse_specs/view_ops\.yaml,line=\d+,col=\d+::.*sometimes", log, re.M
    ), log
    # the same pull request with the spec fixed passes
    (repo / "reuse_specs" / "view_ops.yaml").write_text(bundled.read_text() + "# reviewed\n")
    git(repo, "commit", "-q", "-am", "fix")
    contexts["github"]["event"]["pull_request"]["head"]["sha"] = git(repo, "rev-parse", "HEAD")
    result = walk(job, repo, contexts, runner, uses)
    assert contexts["steps"]["Check the changed specs"]["outcome"] == "success", result.logs
