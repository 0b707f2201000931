"""GitHub: check runs through a GitHub App, or commit statuses with a plain token.

App authentication: an RS256 JWT (issued 60 s in the past, valid 9 minutes, under
GitHub's 10) buys an installation token, cached until a minute before it expires.
GitHub's limits are kept on our side: summary and text 65,535 characters, 50
annotations per request (the rest go in PATCHes, progress saved after each, so a retry
never repeats a batch), 1,000 statuses per (sha, context). A rate limit (primary:
``x-ratelimit-remaining: 0`` until ``x-ratelimit-reset``; secondary: ``Retry-After``)
reschedules the message instead of failing it.

Over 400 lines on purpose: one target, one protocol: authentication, the check-run and
status bodies under GitHub's limits, the batched annotations and the rate-limit rules
depend on each other, and the other targets (``crcr``, ``hud``) are one module each too.
"""

from __future__ import annotations

import html
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jwt
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ci_relay.context import RelayContext
from ci_relay.execution.excerpt import head_and_tail
from ci_relay.reporting import levels
from ci_relay.reporting.build import RunFacts, artifact_url, counts_of, load_facts, run_url
from ci_relay.reporting.caps import clip, clip_chars
from ci_relay.reporting.names import check_name
from ci_relay.reporting.transport import (
    Rejected,
    RetryLater,
    Send,
    SendContext,
    check,
    describe,
    request,
    retry_after,
)
from ci_relay.reporting.wire import MAX_FAILED_TESTS, TriageVerdict
from ci_relay.settings import Settings
from ci_relay.store.models import OutboxMessage, OutboxState

TARGET = "github"
MAX_OUTPUT_CHARS = 65_535
MAX_ANNOTATIONS_PER_REQUEST = 50
MAX_ANNOTATIONS = MAX_FAILED_TESTS
MAX_STATUSES = 1000
MAX_STATUS_DESCRIPTION = 140
# GitHub allows 64 KB of raw_details per annotation; 50 of those would make one request 3 MB
MAX_RAW_DETAILS = 8 * 1024
TRACEBACK_BYTES = 4 * 1024  # per failure in the check run's text
MAX_DRIFT_LINES = 50  # spec drift items in a check run's summary; the run page has them all
JWT_BACKDATE = 60
JWT_LIFETIME = 9 * 60
TOKEN_MARGIN = 60  # refresh an installation token this long before it expires
SECONDARY_LIMIT_WAIT = 60  # GitHub: wait at least a minute when no header says how long
API_VERSION = "2022-11-28"


class Unauthorized(Rejected):
    """401: a token GitHub no longer accepts (or a JWT it cannot verify)."""


# --- the API, with GitHub's rate limits turned into RetryLater ---------------------------


class Api:
    """Calls to GitHub's REST API, waiting out rate limits by rescheduling."""

    def __init__(self, client: httpx.Client, base_url: str, now: datetime) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.now = now
        self.exhausted_until: datetime | None = None

    def call(
        self, method: str, path: str, auth: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        if self.exhausted_until is not None:
            raise RetryLater("GitHub rate limit used up", self.exhausted_until)
        headers = {
            "authorization": auth,
            "accept": "application/vnd.github+json",
            "x-github-api-version": API_VERSION,
            "user-agent": "ci-relay",
        }
        response = request(self.client, method, self.base_url + path, json=body, headers=headers)
        self._rate_limited(response)
        if response.status_code == 401:
            raise Unauthorized(describe(response), 401)
        check(response, self.now)
        if response.headers.get("x-ratelimit-remaining") == "0":
            self.exhausted_until = _reset_time(response)
        data = response.json() if response.content else {}
        return data if isinstance(data, dict) else {"items": data}

    def _rate_limited(self, response: httpx.Response) -> None:
        if response.status_code not in (403, 429):
            return
        retry = response.headers.get("retry-after")
        if retry is not None:
            raise RetryLater(
                f"GitHub secondary rate limit: {describe(response)}",
                retry_after(retry, datetime.now(UTC)),
            )
        if response.headers.get("x-ratelimit-remaining") == "0":
            raise RetryLater(f"GitHub rate limit: {describe(response)}", _reset_time(response))
        if "rate limit" in response.text.lower():
            raise RetryLater(
                f"GitHub secondary rate limit: {describe(response)}",
                datetime.fromtimestamp(time.time() + SECONDARY_LIMIT_WAIT, UTC),
            )


def _reset_time(response: httpx.Response) -> datetime:
    reset = response.headers.get("x-ratelimit-reset", "")
    seconds = int(reset) if reset.isdigit() else int(time.time()) + SECONDARY_LIMIT_WAIT
    return datetime.fromtimestamp(max(seconds, int(time.time()) + 1), UTC)


# --- GitHub App authentication --------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    value: str
    expires_at: float  # epoch seconds


class AppAuth:
    """JWTs and installation tokens of one GitHub App; tokens are shared per process."""

    _tokens: dict[tuple[str, str, int], _Token] = {}  # noqa: RUF012 - a process-wide cache
    _installations: dict[tuple[str, str, str], int] = {}  # noqa: RUF012
    _lock = threading.Lock()

    def __init__(self, settings: Settings) -> None:
        if not settings.github_app_id:
            raise Rejected("CI_RELAY_GITHUB_APP_ID is not set")
        self.app_id = settings.github_app_id
        self.api_url = settings.github_api_url.rstrip("/")
        self.installation_id = settings.github_installation_id
        self._key = _private_key(settings)

    def jwt(self) -> str:
        """An App JWT: issued 60 s ago (clock drift), expiring well within GitHub's 10 min."""
        now = int(time.time())
        claims = {"iat": now - JWT_BACKDATE, "exp": now + JWT_LIFETIME, "iss": self.app_id}
        return jwt.encode(claims, self._key, algorithm="RS256")

    def installation(self, api: Api, repository: str) -> int:
        if self.installation_id is not None:
            return self.installation_id
        key = (self.api_url, self.app_id, repository)
        with self._lock:
            known = self._installations.get(key)
        if known is not None:
            return known
        data = api.call("GET", f"/repos/{repository}/installation", f"Bearer {self.jwt()}")
        found = int(data["id"])
        with self._lock:
            self._installations[key] = found
        return found

    def token(self, api: Api, repository: str, fresh: bool = False) -> str:
        """An installation token, from the cache unless it is near expiry or ``fresh``."""
        installation = self.installation(api, repository)
        key = (self.api_url, self.app_id, installation)
        with self._lock:
            cached = self._tokens.get(key)
        if cached is not None and not fresh and cached.expires_at - TOKEN_MARGIN > time.time():
            return cached.value
        data = api.call(
            "POST", f"/app/installations/{installation}/access_tokens", f"Bearer {self.jwt()}"
        )
        expires = datetime.fromisoformat(str(data["expires_at"]).replace("Z", "+00:00"))
        token = _Token(str(data["token"]), expires.timestamp())
        with self._lock:
            self._tokens[key] = token
        return token.value

    @classmethod
    def forget(cls) -> None:
        """Drop cached tokens and installation ids (a new process starts like this)."""
        with cls._lock:
            cls._tokens.clear()
            cls._installations.clear()


def _private_key(settings: Settings) -> str:
    if settings.github_app_private_key:
        return settings.github_app_private_key.get_secret_value()
    path: Path | None = settings.github_app_private_key_file
    if path is None:
        raise Rejected("no GitHub App private key (CI_RELAY_GITHUB_APP_PRIVATE_KEY(_FILE))")
    return path.read_text(encoding="utf-8")


# --- what a check run and a status say --------------------------------------------------


def _counts_line(facts: RunFacts) -> str:
    c = counts_of(facts)
    return f"{c.failed} failed, {c.passed} passed, {c.skipped} skipped (of {c.total})"


def _level_note(facts: RunFacts, settings: Settings) -> str:
    if levels.blocking(facts.level):
        return f"{facts.level}: blocking"
    return f"{facts.level}: advisory, failures conclude neutral"


def output(facts: RunFacts, settings: Settings, event: str) -> dict[str, str]:
    """Title, summary and text of a check run, each within GitHub's 65,535 characters."""
    url = run_url(settings, facts.run_id)
    link = f" Details: {url}" if url else ""
    if event != "completed":
        return {
            "title": "running",
            "summary": clip_chars(
                f"Running upstream tests on `{facts.backend}` (attempt {facts.attempt}, "
                f"{_level_note(facts, settings)}).{link}",
                MAX_OUTPUT_CHARS,
            ),
        }
    summary = (
        f"**{_counts_line(facts)}** on `{facts.backend}`, attempt {facts.attempt} "
        f"({_level_note(facts, settings)}).{link}"
    )
    for problem in facts.infra_errors:
        summary += f"\n\n**Infrastructure error:** {clip(problem, 2048)}"
    if facts.spec_drift:
        summary += (
            f"\n\n### Spec drift ({len(facts.spec_drift)})\n\nThe specs list names this upstream "
            "revision does not have; the rest ran.\n\n"
            + "\n".join(f"- `{clip(line, 512)}`" for line in facts.spec_drift[:MAX_DRIFT_LINES])
        )
        if len(facts.spec_drift) > MAX_DRIFT_LINES:
            summary += f"\n- … and {len(facts.spec_drift) - MAX_DRIFT_LINES} more on the run page"
    if facts.verdict is not None:
        summary += "\n\n" + verdict_markdown(facts.verdict)
    lines = [f"### Failed tests ({len(facts.failures)} of {facts.failed_total} listed)", ""]
    for failure in facts.failures:
        first = (failure.text or "").strip().splitlines()[:1]
        detail = f": {clip(first[0], 1024)}" if first else ""
        lines.append(f"- `{failure.nodeid}` ({failure.outcome}){detail}")
    everything = artifact_url(settings, facts.run_id)
    if facts.failed_total > len(facts.failures) and everything:
        lines += ["", f"All results: {everything}"]
    result = {"title": _counts_line(facts), "summary": clip_chars(summary, MAX_OUTPUT_CHARS)}
    if facts.failures:
        listing = "\n".join(lines)
        room = MAX_OUTPUT_CHARS - len(listing) - 200  # for the line saying what did not fit
        result["text"] = clip_chars(listing + _tracebacks(facts, room, url), MAX_OUTPUT_CHARS)
    return result


def verdict_markdown(verdict: TriageVerdict) -> str:
    """Triage's verdict as the check summary shows it: category, confidence, why."""
    suspect = (
        f" Suspected upstream change: `{clip(verdict.suspected_upstream, 128)}`."
        if verdict.suspected_upstream
        else ""
    )
    lines = [
        f"### Triage: {verdict.category} ({verdict.confidence} confidence)",
        "",
        f"{verdict.summary}{suspect}",
        "",
    ]
    lines += [f"- {clip(e, 512)}" for e in verdict.evidence]
    return "\n".join(lines) + "\n\n_Advisory: the verdict never changes the conclusion._"


def _fenced(text: str) -> str:
    """``text`` as a Markdown code block whose fence no backtick run in it can close."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def _tracebacks(facts: RunFacts, room: int, url: str | None) -> str:
    """Each failure's full text as a collapsed block, in list order, while they fit in
    ``room`` characters (the list of failures above them is never cut for them)."""
    with_details = [f for f in facts.failures if f.details]
    if not with_details:
        return ""
    blocks: list[str] = []
    used = 0
    for failure in with_details:
        block = (
            f"<details><summary><code>{html.escape(failure.nodeid)}</code></summary>\n\n"
            f"{_fenced(head_and_tail(failure.details or '', TRACEBACK_BYTES))}\n\n</details>"
        )
        if used + len(block) + 2 > room:
            break
        blocks.append(block)
        used += len(block) + 2
    out = "\n\n### Tracebacks\n\n" + "\n\n".join(blocks)
    left = len(with_details) - len(blocks)
    if left:
        where = f": {url}" if url else " in the relay's results"
        out += f"\n\n{left} more traceback(s){where}"
    return out


def annotations_for(facts: RunFacts) -> list[dict[str, Any]]:
    level = "failure" if levels.blocking(facts.level) else "warning"
    out: list[dict[str, Any]] = []
    for failure in facts.failures[:MAX_ANNOTATIONS]:
        text = (failure.text or failure.outcome).strip() or failure.outcome
        note: dict[str, Any] = {
            "path": failure.nodeid.split("::", 1)[0] or ".",
            "start_line": 1,
            "end_line": 1,
            "annotation_level": level,
            "title": clip_chars(failure.nodeid, 255),
            "message": clip(text, 4096),
        }
        if failure.details:  # GitHub shows it folded under the message
            note["raw_details"] = head_and_tail(failure.details, MAX_RAW_DETAILS)
        out.append(note)
    return out


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


# --- sending --------------------------------------------------------------------------


def prepare(session: Session, rt: RelayContext, message: OutboxMessage) -> Send:
    settings = rt.settings
    event = str(message.payload.get("event", "completed"))
    mode = str(message.payload.get("mode", "check"))
    facts = load_facts(session, message.run_id, with_failures=event == "completed")
    if mode == "status":
        posted = (
            session.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(
                    OutboxMessage.target == TARGET,
                    OutboxMessage.key == message.key,
                    OutboxMessage.state == OutboxState.SENT,
                )
            )
            or 0
        )
        return _status_sender(settings, facts, event, posted)
    return _check_sender(settings, facts, event)


def _status_sender(settings: Settings, facts: RunFacts, event: str, posted: int) -> Send:
    if not settings.github_token:
        raise Rejected("CI_RELAY_GITHUB_TOKEN is not set")
    if posted >= MAX_STATUSES:
        raise Rejected(
            f"{posted} statuses already posted for this (sha, context); GitHub keeps "
            f"at most {MAX_STATUSES}"
        )
    token = settings.github_token.get_secret_value()
    context = check_name(settings, facts.backend)
    if event == "completed":
        state = levels.status_state(facts.level, facts.conclusion)
        description = f"{_counts_line(facts)} ({_level_note(facts, settings)})"
    else:
        state, description = "pending", f"running on {facts.backend}"
    body = {
        "state": state,
        "context": context,
        "description": clip_chars(description, MAX_STATUS_DESCRIPTION),
        "target_url": run_url(settings, facts.run_id),
    }

    def send(ctx: SendContext) -> dict[str, Any]:
        api = Api(ctx.client, settings.github_api_url, ctx.now)
        api.call(
            "POST", f"/repos/{facts.repository}/statuses/{facts.head_sha}", f"token {token}", body
        )
        return {"state": state, "context": context}

    return send


def _check_sender(settings: Settings, facts: RunFacts, event: str) -> Send:
    auth = AppAuth(settings)
    completed = event == "completed"
    out = output(facts, settings, event)
    notes = annotations_for(facts) if completed else []
    batches = [
        notes[i : i + MAX_ANNOTATIONS_PER_REQUEST]
        for i in range(0, len(notes), MAX_ANNOTATIONS_PER_REQUEST)
    ]
    main: dict[str, Any] = {
        "name": check_name(settings, facts.backend),
        "status": "completed" if completed else "in_progress",
        "started_at": _iso(facts.started_at or facts.created_at),
        "external_id": str(facts.run_id),
        "output": {**out, "annotations": batches[0] if batches else []},
    }
    url = run_url(settings, facts.run_id)
    if url:
        main["details_url"] = url
    if completed:
        main["conclusion"] = levels.check_conclusion(facts.level, facts.conclusion)
        main["completed_at"] = _iso(facts.finished_at or facts.started_at or facts.created_at)
    repo = facts.repository

    def send(ctx: SendContext) -> dict[str, Any]:
        nonlocal notes, main
        if ctx.earlier.get("annotations_done"):  # an update (triage's verdict): GitHub
            notes = []  # appends annotations, and the first completed report sent them all
            main = {**main, "output": {**out, "annotations": []}}
        api = Api(ctx.client, settings.github_api_url, ctx.now)
        state: dict[str, Any] = {"annotations_sent": 0, "main_done": False}
        check_id = ctx.own.get("check_run_id") or ctx.earlier.get("check_run_id")
        if ctx.own.get("main_done"):
            state.update(ctx.own)
        token = auth.token(api, repo)

        def call(method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
            nonlocal token
            try:
                return api.call(method, path, f"Bearer {token}", body)
            except Unauthorized:  # revoked or expired early: one fresh token, then give up
                token = auth.token(api, repo, fresh=True)
                return api.call(method, path, f"Bearer {token}", body)

        if not state["main_done"]:
            created = None
            if check_id:
                try:
                    created = call("PATCH", f"/repos/{repo}/check-runs/{check_id}", main)
                except Rejected as exc:
                    if exc.status != 404:  # a deleted check run is created again
                        raise
            if created is None:
                created = call(
                    "POST", f"/repos/{repo}/check-runs", {**main, "head_sha": facts.head_sha}
                )
            check_id = created.get("id", check_id)
            state.update(
                check_run_id=check_id,
                html_url=created.get("html_url"),
                main_done=True,
                annotations_sent=len(batches[0]) if batches else 0,
            )
            ctx.save(dict(state))
        sent = int(state["annotations_sent"])
        while sent < len(notes):
            batch = notes[sent : sent + MAX_ANNOTATIONS_PER_REQUEST]
            call(
                "PATCH",
                f"/repos/{repo}/check-runs/{check_id}",
                {"output": {**out, "annotations": batch}},
            )
            sent += len(batch)
            state["annotations_sent"] = sent
            ctx.save(dict(state))
        if completed:
            state["annotations_done"] = True
        return state

    return send
