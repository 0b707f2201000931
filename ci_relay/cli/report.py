"""``ci-relay report crcr`` and ``ci-relay dispatch-info``: CRCR from a GitHub Actions job.

For a downstream repository that runs the tests on its own runners (``workflows/``): the
job reads the dispatched change with ``dispatch-info`` and reports in_progress/completed
with ``report crcr``. The work is in :mod:`ci_relay.reporting.job_report`; this is the command line.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ci_relay.cli.consoles import err, out

if TYPE_CHECKING:  # the job report module loads only when a report is sent
    from ci_relay.reporting.job_report import JobIdentity, RetryPolicy


EXIT_REFUSED = 1  # the callback answered 4xx: our body is wrong, sending it again won't help
EXIT_BAD_INPUT = 2
EXIT_GAVE_UP = 3  # 5xx or network errors until the attempts ran out

report_app = typer.Typer(help="Report a CI job's status to other systems.", no_args_is_help=True)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(code)


def _note(line: str) -> None:
    err.print(line, markup=False, soft_wrap=True)


def _time(value: str | None, option: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _fail(f"{option} {value!r} is not an ISO 8601 time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _run_url(run_id: str) -> str | None:
    """The Actions run page, from the variables every job has."""
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server.rstrip('/')}/{repo}/actions/runs/{run_id}" if server and repo else None


@report_app.command("crcr")
def report_crcr(
    status: Annotated[str, typer.Option(help="in_progress | completed")],
    callback_url: Annotated[
        str | None, typer.Option(help="The CRCR callback endpoint (not needed with --dry-run).")
    ] = None,
    junit: Annotated[
        list[Path] | None,
        typer.Option(help="JUnit XML of the run (repeatable); a missing file counts no tests."),
    ] = None,
    conclusion: Annotated[
        str,
        typer.Option(
            help="The job's status (job.status: success, failure, cancelled, …); "
            "failed tests in the JUnit turn success into failure."
        ),
    ] = "success",
    event: Annotated[
        Path | None,
        typer.Option(
            envvar="GITHUB_EVENT_PATH", help="The repository_dispatch event holding the envelope."
        ),
    ] = None,
    event_type: Annotated[
        str | None,
        typer.Option(help="With --delivery-id: report without a dispatch (e.g. nightly)."),
    ] = None,
    delivery_id: Annotated[
        str | None, typer.Option(help="With --event-type: e.g. the upstream sha tested.")
    ] = None,
    name: Annotated[
        str, typer.Option(envvar="GITHUB_WORKFLOW", help="workflow.name.")
    ] = "ci-relay",
    job_name: Annotated[
        str | None, typer.Option(envvar="GITHUB_JOB", help="workflow.job_name.")
    ] = None,
    run_id: Annotated[
        str | None, typer.Option(envvar="GITHUB_RUN_ID", help="workflow.run_id.")
    ] = None,
    run_attempt: Annotated[
        int, typer.Option(envvar="GITHUB_RUN_ATTEMPT", min=1, help="workflow.run_attempt.")
    ] = 1,
    check_run_id: Annotated[
        str | None,
        typer.Option(help="The job's check run (job.check_run_id); default run_id-attempt."),
    ] = None,
    url: Annotated[
        str | None, typer.Option(help="workflow.url; default: this Actions run's page.")
    ] = None,
    artifact_url: Annotated[
        str | None, typer.Option(help="Where the full results are (the uploaded JUnit).")
    ] = None,
    started_at: Annotated[
        str | None,
        typer.Option(help="ISO time the job started (in_progress prints it); default now."),
    ] = None,
    token_env: Annotated[
        str | None,
        typer.Option(help="Name of the environment variable holding a bearer token."),
    ] = None,
    oidc: Annotated[
        bool,
        typer.Option(
            "--oidc", help="Without a token, authenticate with a GitHub OIDC token (id-token)."
        ),
    ] = False,
    oidc_audience: Annotated[str, typer.Option(help="Audience of the OIDC token.")] = "",
    attempts: Annotated[int, typer.Option(min=1, help="Tries on 5xx and network errors.")] = 5,
    backoff: Annotated[
        float, typer.Option(min=0, help="Seconds before the 2nd try, doubled after.")
    ] = 2.0,
    max_wait: Annotated[
        float, typer.Option(min=0, help="Longest pause, whatever Retry-After asks.")
    ] = 120.0,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds per request.")] = 30.0,
    output: Annotated[Path | None, typer.Option(help="Also write the body here.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the body; send nothing.")
    ] = False,
) -> None:
    """Send the CRCR callback (status, counts, failed tests) from a CI job.

    The body is the relay's own format and caps: 1,000 failed tests,
    1 KB messages, 4 KB stacktraces, 2,000,000 bytes. Exit 0 sent;
    1 refused (a 4xx: the body is wrong); 2 bad input; 3 still failing
    (5xx or network errors) after the retries.
    """
    from ci_relay.reporting.job_report import JobIdentity, RetryPolicy

    if status not in ("in_progress", "completed"):
        raise _fail(f"--status {status!r}: use in_progress or completed")
    if not run_id:
        raise _fail("--run-id is needed (GITHUB_RUN_ID is unset: not in GitHub Actions?)")
    if not job_name:
        raise _fail("--job-name is needed (GITHUB_JOB is unset: not in GitHub Actions?)")
    if not dry_run and not callback_url:
        raise _fail("--callback-url is needed (empty: is the repository variable set?)")
    policy = RetryPolicy(attempts=attempts, backoff=backoff, max_wait=max_wait, timeout=timeout)
    job = JobIdentity(
        name=name,
        job_name=job_name,
        run_id=run_id,
        run_attempt=run_attempt,
        check_run_id=check_run_id or None,
        url=url or _run_url(run_id),
        artifact_url=artifact_url or None,
    )
    body = _crcr_body(status, job, conclusion, junit, event, event_type, delivery_id, started_at)
    if output is not None:
        output.write_bytes(body)
    if dry_run:
        print(body.decode("utf-8"))
        return
    assert callback_url is not None
    response_code = _crcr_send(callback_url, body, token_env, oidc, oidc_audience, policy)
    out.print(f"CRCR {status} sent: HTTP {response_code}, {len(body)} bytes", soft_wrap=True)


def _crcr_body(
    status: str,
    job: JobIdentity,
    conclusion: str,
    junit: list[Path] | None,
    event: Path | None,
    event_type: str | None,
    delivery_id: str | None,
    started_at: str | None,
) -> bytes:
    """The callback's body: the envelope (from the dispatch event, or named), the JUnit counts
    of a completed job, the job's identity; an in_progress job also records its start."""
    from ci_relay.reporting.job_report import (
        Envelope,
        JobReportError,
        JunitSummary,
        callback_body,
        read_envelope,
        read_junit,
        write_github_output,
    )

    try:
        if event_type or delivery_id:
            if not (event_type and delivery_id):
                raise JobReportError("--event-type and --delivery-id go together")
            envelope = Envelope(event_type, delivery_id, {})
        elif event is not None:
            envelope = read_envelope(event)
        else:
            raise JobReportError("no --event (GITHUB_EVENT_PATH) and no --event-type/--delivery-id")
        summary: JunitSummary | None = None
        if status == "completed" and junit:
            present = [p for p in junit if p.is_file()]
            for missing in sorted(set(junit) - set(present)):
                _note(f"no JUnit at {missing}: counted as no tests (did the run start?)")
            summary = read_junit(present)
        start = _time(started_at, "--started-at") or datetime.now(UTC)
        body = callback_body(
            envelope,
            job,
            status,
            started_at=start,
            job_status=conclusion,
            summary=summary,
        )
        if status == "in_progress":  # the completed step reports the same start
            write_github_output({"started_at": start.isoformat()})
    except JobReportError as exc:
        raise _fail(str(exc)) from None
    return body


def _crcr_send(
    callback_url: str,
    body: bytes,
    token_env: str | None,
    oidc: bool,
    audience: str,
    policy: RetryPolicy,
) -> int:
    """POST the body with its bearer token (from the named variable, or GitHub's OIDC);
    the HTTP status, or exit 1 on a refusal and 3 when the retries ran out."""
    from ci_relay.reporting.job_report import (
        OIDC_AUDIENCE,
        JobReportError,
        SendFailed,
        bearer_token,
        send,
    )

    headers = {"content-type": "application/json", "user-agent": "ci-relay"}
    try:
        token = bearer_token(
            token_env, (audience or OIDC_AUDIENCE) if oidc else None, policy=policy, note=_note
        )
    except JobReportError as exc:
        raise _fail(str(exc)) from None
    if token:
        headers["authorization"] = f"Bearer {token}"
    try:
        response = send(
            "POST", callback_url, content=body, headers=headers, policy=policy, note=_note
        )
    except SendFailed as exc:
        if exc.refused:
            raise _fail(f"the callback refused the report: {exc.reason}", EXIT_REFUSED) from None
        raise _fail(f"the callback could not be reached: {exc.reason}", EXIT_GAVE_UP) from None
    return int(response.status_code)


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")

    @app.command("dispatch-info")
    def dispatch_info_command(
        event: Annotated[
            Path,
            typer.Option(
                envvar="GITHUB_EVENT_PATH", help="The repository_dispatch event (JSON file)."
            ),
        ],
        repository: Annotated[
            str | None,
            typer.Option(help="Refuse a dispatch about any other upstream repository."),
        ] = None,
    ) -> None:
        """Read a CRCR dispatch: upstream head/base, PR number, runs tests?

        Prints key=value lines and appends them to $GITHUB_OUTPUT (the
        step's outputs). Every value is checked (shas are 40 hex digits),
        so a job can hand them to git.
        """
        from ci_relay.reporting.job_report import (
            JobReportError,
            dispatch_info,
            read_envelope,
            write_github_output,
        )

        try:
            info = dispatch_info(read_envelope(event), repository)
            values = info.outputs()
            write_github_output(values)
        except JobReportError as exc:
            raise _fail(str(exc)) from None
        for key, value in values.items():
            print(f"{key}={value}")
