"""CRCR callbacks from a CI job that runs outside the relay (a GitHub Actions job).

A downstream repository may run ``ci-relay select`` and ``ci-relay run`` on its own
GitHub runners instead of through the relay service. Its job must still report in the
CRCR callback format, so this module builds that body from the job's JUnit XML with the
models and caps the relay's own reporter uses (:mod:`ci_relay.reporting.wire`,
:mod:`ci_relay.reporting.caps`) and sends it with the same rule
(:mod:`ci_relay.reporting.transport`): a 4xx other than 408/429 stops, a 5xx, 408, 429 or
a network error is retried, at the time ``Retry-After`` asks for when it says one.

Nothing here needs the database, the queue or the command line.

Over 400 lines on purpose: it is the runner-side twin of the relay's CRCR reporter (JUnit
reading, the callback body, the send with its retry rule) and must install and run on a
bare GitHub runner as one unit; ``ci_relay.cli.report`` is only its command line.
"""

from __future__ import annotations

import json
import os
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from ci_relay.reporting import caps
from ci_relay.reporting.caps import Budget, ReportTooLarge, fit
from ci_relay.reporting.transport import Rejected, RetryLater, check, request
from ci_relay.reporting.wire import (
    MAX_SEND_BYTES,
    SCHEMA_VERSION,
    CallbackPayload,
    FailedTest,
    TestCounts,
    Workflow,
    compact_json,
)

# What GitHub accepts as a check run's conclusion (CRCR passes ours on to the upstream check).
CONCLUSIONS = frozenset(
    {"success", "failure", "cancelled", "neutral", "skipped", "timed_out", "action_required"}
)
OIDC_AUDIENCE = "pytorch-cross-repo-ci-relay"  # what PyTorch's relay expects in the token


class JobReportError(Exception):
    """Bad input for a report (no envelope, unreadable JUnit, no credentials)."""


class SendFailed(Exception):
    """The callback did not go through; ``refused`` when the target said our body is wrong."""

    def __init__(self, reason: str, refused: bool, attempts: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refused = refused
        self.attempts = attempts


# --- the JUnit side -----------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One JUnit test case as the report sees it."""

    nodeid: str
    file: str | None
    outcome: str  # passed | failed | error | crashed | skipped | xfailed
    message: str = ""
    text: str = ""


@dataclass
class JunitSummary:
    """Counts of every case and the failing ones in file order (only 1,000 are sent)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    total: int = 0
    failures: list[Case] = field(default_factory=list)

    def counts(self) -> TestCounts:
        return TestCounts(
            passed=self.passed, failed=self.failed, skipped=self.skipped, total=self.total
        )


def _nodeid(case: ET.Element) -> tuple[str, str | None]:
    """A pytest-like node id from a testcase; JUnit only keeps a dotted class name.

    ``file`` (xunit1) wins; then the ``.py`` our own JUnit writer leaves in the class
    name; else the dotted prefix before the first CamelCase part is taken as the module,
    which is how PyTorch's test classes are named.
    """
    classname, name = case.get("classname", ""), case.get("name", "")
    path = case.get("file")
    parts = classname.split(".") if classname else []
    if path is None:
        if ".py." in f"{classname}.":
            head, _, tail = f"{classname}.".partition(".py.")
            path, parts = head.replace(".", "/") + ".py", [p for p in tail.split(".") if p]
        else:
            split = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
            if split:
                path, parts = "/".join(parts[:split]) + ".py", parts[split:]
    else:
        module = path.removesuffix(".py").replace("/", ".")
        parts = classname.removeprefix(module).strip(".").split(".") if classname else []
    pieces = [p for p in (path, *parts, name) if p]
    return "::".join(pieces), path


def _case(element: ET.Element) -> Case:
    nodeid, path = _nodeid(element)
    for tag, outcome in (("failure", "failed"), ("error", "error")):
        found = element.find(tag)
        if found is not None:
            if found.get("type") == "crashed":  # what our shard runner writes for a dead process
                outcome = "crashed"
            return Case(nodeid, path, outcome, found.get("message") or "", found.text or "")
    skipped = element.find("skipped")
    if skipped is not None:  # pytest writes an expected failure as a skip of type pytest.xfail
        outcome = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        return Case(nodeid, path, outcome)
    return Case(nodeid, path, "passed")


def read_junit(paths: Iterable[Path]) -> JunitSummary:
    """Count the cases of JUnit files; expected failures count as passed, as in the relay."""
    summary = JunitSummary()
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            raise JobReportError(f"{path}: not a readable JUnit XML file ({exc})") from None
        for element in root.iter("testcase"):
            case = _case(element)
            summary.total += 1
            if case.outcome in ("failed", "error", "crashed"):
                summary.failed += 1
                summary.failures.append(case)
            elif case.outcome == "skipped":
                summary.skipped += 1
            else:
                summary.passed += 1
    return summary


def failed_test(case: Case, budget: Budget) -> FailedTest:
    """A failing case as the relay reports one: the message (else the text's first line),
    and the text as stacktrace, cut to the budget the same way (head and tail kept)."""
    text = case.text.strip()
    message = case.message.strip() or (text.splitlines()[0] if text else "")
    return caps.failed_test(case.nodeid, case.outcome, message, budget, details=text)


def conclusion(job_status: str | None, summary: JunitSummary | None) -> str:
    """The job's own status, made a failure when the JUnit says a test failed."""
    status = (job_status or "success").strip().lower()
    if status not in CONCLUSIONS:
        raise JobReportError(
            f"conclusion {job_status!r} is not one of {', '.join(sorted(CONCLUSIONS))}"
        )
    if status in ("success", "neutral") and summary is not None and summary.failed:
        return "failure"
    return status


# --- the dispatch side --------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """What CRCR dispatched: it goes back unchanged in the callback."""

    event_type: str
    delivery_id: str
    payload: dict[str, Any]


def read_envelope(event_path: Path) -> Envelope:
    """The CRCR envelope of a ``repository_dispatch`` event file (``$GITHUB_EVENT_PATH``)."""
    from ci_relay.intake.wire import DispatchEnvelope  # the relay's own reading of it

    try:
        data = json.loads(event_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JobReportError(f"{event_path}: cannot read the event ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("client_payload"), dict):
        data = data["client_payload"]
    try:
        envelope = DispatchEnvelope.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "client_payload"
        raise JobReportError(
            f"{event_path}: not a CRCR dispatch (client_payload.{where}: {first['msg']})"
        ) from None
    return Envelope(envelope.event_type, envelope.delivery_id, envelope.payload)


def payload_digest(payload: dict[str, Any]) -> dict[str, Any]:
    """What is kept of the upstream webhook when the body must shrink: repository and commit."""
    digest: dict[str, Any] = {"truncated": True}
    repo = payload.get("repository")
    if isinstance(repo, dict) and isinstance(repo.get("full_name"), str):
        digest["repository"] = {"full_name": repo["full_name"]}
    for key in ("action", "after", "number"):
        if isinstance(payload.get(key), str | int):
            digest[key] = payload[key]
    pr = payload.get("pull_request")
    if isinstance(pr, dict):
        head = pr.get("head")
        sha = head.get("sha") if isinstance(head, dict) else None
        digest["pull_request"] = {"number": pr.get("number"), "head": {"sha": sha}}
    return digest


@dataclass(frozen=True)
class DispatchInfo:
    """What a job needs to know about the dispatched change, every value shell-safe."""

    event_type: str
    delivery_id: str
    repository: str
    kind: str
    head_sha: str
    base: str
    number: int | None
    runs_tests: bool
    reason: str

    def outputs(self) -> dict[str, str]:
        return {
            "event_type": self.event_type,
            "delivery_id": self.delivery_id,
            "repository": self.repository,
            "kind": self.kind,
            "head_sha": self.head_sha,
            "base": self.base,
            "number": "" if self.number is None else str(self.number),
            "runs_tests": "true" if self.runs_tests else "false",
            "reason": self.reason,
        }


def dispatch_info(envelope: Envelope, expect_repository: str | None) -> DispatchInfo:
    """Read the upstream change the way the relay's intake does (:func:`summarize`).

    Everything returned is checked against a strict pattern (:mod:`ci_relay.identifiers`,
    as at the relay's intake), because a workflow writes it to ``$GITHUB_OUTPUT`` and hands
    it to git: a crafted payload must not inject.
    """
    from ci_relay.identifiers import InvalidIdentifier, delivery_id, event_name
    from ci_relay.intake.events import InvalidPayload, summarize

    try:
        event_name(envelope.event_type)
        delivery_id(envelope.delivery_id)
    except InvalidIdentifier as exc:
        raise JobReportError(f"the envelope's {exc}; a job will not pass it on") from None
    try:
        seen = summarize(envelope.event_type, envelope.payload)
    except InvalidPayload as exc:  # the relay's intake refuses the same payloads
        raise JobReportError(f"payload field {exc}") from None
    change = seen.change
    repository = change.repository if change else seen.repository or ""
    if expect_repository and repository.lower() != expect_repository.lower():
        raise JobReportError(f"the dispatch is for {repository!r}, not {expect_repository!r}")
    if change is None or not change.runs_tests:
        reason = seen.ignore_reason or f"{envelope.event_type} {seen.action or ''} runs no tests"
        return DispatchInfo(
            envelope.event_type,
            envelope.delivery_id,
            repository,
            change.kind if change else "",
            seen.head_sha or "",
            "",
            change.number if change else None,
            False,
            re.sub(r"[^\w .:/()-]", "_", reason.strip())[:200],
        )
    # a new branch or a rerun has no base: compare with the parent, as the relay's select does
    base = change.base_sha or f"{change.head_sha}^"
    return DispatchInfo(
        envelope.event_type,
        envelope.delivery_id,
        change.repository,
        change.kind,
        change.head_sha,
        base,
        change.number,
        True,
        "",
    )


# --- the body -----------------------------------------------------------------------------


def _identifier(value: str) -> int | str:
    """GitHub ids are numbers; keep anything else as the string it is."""
    return int(value) if value.isdigit() else value


@dataclass(frozen=True)
class JobIdentity:
    """Who reports: the workflow run and job, as CRCR and HUD key their records."""

    name: str
    job_name: str
    run_id: str
    run_attempt: int = 1
    check_run_id: str | None = None
    url: str | None = None
    artifact_url: str | None = None


def callback_body(
    envelope: Envelope,
    job: JobIdentity,
    status: str,
    *,
    started_at: datetime,
    completed_at: datetime | None = None,
    job_status: str | None = None,
    summary: JunitSummary | None = None,
    limit: int = MAX_SEND_BYTES,
) -> bytes:
    """The ``callback_payload`` as sent: the richest rendering that fits in ``limit`` bytes."""
    if status not in ("in_progress", "completed"):
        raise JobReportError(f"status {status!r} is neither in_progress nor completed")
    completed = status == "completed"
    final = conclusion(job_status, summary) if completed else None
    failures = summary.failures if completed and summary is not None else []
    counts = (summary or JunitSummary()).counts() if completed else None

    def render(budget: Budget) -> bytes:
        shown = failures[: budget.entries]
        workflow = Workflow(
            schema_version=SCHEMA_VERSION,
            status="completed" if completed else "in_progress",
            conclusion=final,
            name=job.name,
            url=job.url,
            run_id=_identifier(job.run_id),
            run_attempt=job.run_attempt,
            job_name=job.job_name,
            # without the job's own check run id, the attempt is what tells two runs apart
            check_run_id=_identifier(job.check_run_id or f"{job.run_id}-{job.run_attempt}"),
            started_at=started_at,
            completed_at=(completed_at or datetime.now(UTC)) if completed else None,
            test_results=counts,
            artifact_url=job.artifact_url,
            failed_tests=[failed_test(case, budget) for case in shown],
            failed_tests_omitted=len(failures) - len(shown),
        )
        body = CallbackPayload(
            event_type=envelope.event_type,
            delivery_id=envelope.delivery_id,
            payload=envelope.payload if budget.full_payload else payload_digest(envelope.payload),
            workflow=workflow,
        )
        return compact_json(body.model_dump(mode="json"))

    try:
        body, _ = fit(render, limit)
    except ValidationError as exc:  # e.g. a job name over the format's 256 characters
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise JobReportError(
            f"the report breaks the CRCR format at {where}: {first['msg']}"
        ) from None
    except ReportTooLarge as exc:
        raise JobReportError(str(exc)) from None
    return body


# --- sending ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: a job cannot wait as long as the relay's outbox does."""

    attempts: int = 5
    backoff: float = 2.0  # seconds before the second attempt, doubled after each
    max_wait: float = 120.0  # the longest pause, even when Retry-After asks for more
    timeout: float = 30.0  # per request


def send(
    method: str,
    url: str,
    *,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    policy: RetryPolicy = RetryPolicy(),
    client: httpx.Client | None = None,
    sleep: Callable[[float], None] = time.sleep,
    note: Callable[[str], None] = lambda _line: None,
) -> httpx.Response:
    """One request, retried on 5xx/408/429/network errors; ``SendFailed`` when it never works."""

    def wait(state: RetryCallState) -> float:
        # doubling backoff, unless the answer said when (Retry-After); never past max_wait
        seconds = policy.backoff * 2.0 ** (state.attempt_number - 1)
        failure = state.outcome.exception() if state.outcome else None
        if isinstance(failure, RetryLater) and failure.until is not None:
            seconds = (failure.until - datetime.now(UTC)).total_seconds()
        return min(max(seconds, 0.0), policy.max_wait)

    def tell(state: RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome else None
        reason = failure.reason if isinstance(failure, RetryLater) else str(failure)
        pause = state.next_action.sleep if state.next_action else 0.0
        note(f"attempt {state.attempt_number} failed ({reason}); retrying in {pause:.1f}s")

    own = client is None
    http = client or httpx.Client(timeout=policy.timeout)
    attempts = Retrying(
        retry=retry_if_exception_type(RetryLater),
        stop=stop_after_attempt(policy.attempts),
        wait=wait,
        sleep=sleep,
        before_sleep=tell,
        reraise=True,
    )
    try:
        for attempt in attempts:
            with attempt:
                try:
                    response = request(http, method, url, content=content, headers=headers)
                    check(response, datetime.now(UTC))
                    return response
                except Rejected as exc:
                    number = attempt.retry_state.attempt_number
                    raise SendFailed(exc.reason, refused=True, attempts=number) from None
    except RetryLater as exc:
        raise SendFailed(
            f"gave up after {policy.attempts} attempts: {exc.reason}",
            refused=False,
            attempts=policy.attempts,
        ) from None
    finally:
        if own:
            http.close()
    raise AssertionError("unreachable")  # the loop returns or raises


def bearer_token(
    token_env: str | None,
    oidc_audience: str | None,
    *,
    policy: RetryPolicy = RetryPolicy(),
    environ: dict[str, str] | None = None,
    note: Callable[[str], None] = lambda _line: None,
) -> str | None:
    """The callback's credentials: the token in ``token_env`` when it is set, else a GitHub
    OIDC token for ``oidc_audience`` (what PyTorch's relay checks), else none."""
    env = os.environ if environ is None else environ
    if token_env and env.get(token_env):
        return env[token_env]
    if not oidc_audience:
        if token_env:
            raise JobReportError(f"environment variable {token_env} is empty or unset")
        return None
    url, token = env.get("ACTIONS_ID_TOKEN_REQUEST_URL"), env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN")
    if not url or not token:
        raise JobReportError(
            "no OIDC token can be minted here: the job needs `permissions: id-token: write` "
            "(ACTIONS_ID_TOKEN_REQUEST_URL/TOKEN are unset)"
        )
    full = httpx.URL(url).copy_merge_params({"audience": oidc_audience})
    try:
        response = send(
            "GET",
            str(full),
            headers={"authorization": f"Bearer {token}", "accept": "application/json"},
            policy=policy,
            note=note,
        )
        value = response.json()["value"]
    except SendFailed as exc:
        raise JobReportError(f"minting the OIDC token failed: {exc.reason}") from None
    except (ValueError, KeyError, TypeError):
        raise JobReportError("the OIDC token endpoint answered without a token") from None
    if not isinstance(value, str) or not value:
        raise JobReportError("the OIDC token endpoint answered without a token")
    return value


def write_github_output(values: dict[str, str], environ: dict[str, str] | None = None) -> None:
    """Append ``key=value`` lines to ``$GITHUB_OUTPUT`` (the step's outputs), when set."""
    env = os.environ if environ is None else environ
    target = env.get("GITHUB_OUTPUT")
    if not target:
        return
    for key, value in values.items():
        if "\n" in value or "\r" in value:
            raise JobReportError(f"output {key} holds a line break")
    with open(target, "a", encoding="utf-8") as handle:
        handle.writelines(f"{key}={value}\n" for key, value in values.items())
