"""Loopback servers that speak the reporters' real protocols, and runs to report on.

Each fake is a real HTTP server (``http.server`` in a thread, real sockets) that checks
requests the way the real service does, independently of our own wire models: the CRCR
callback receiver checks the workflow format and its caps, the HUD receiver its bot
header and 2 MB limit, the GitHub fake verifies App JWTs with RS256 and the App's public
key, issues expiring installation tokens, and enforces GitHub's output and annotation
limits and its rate-limit answers. ``script`` makes any of them answer a few requests
with a chosen status and headers first (a 500 forever, a 429 with Retry-After, ...).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import insert

from ci_relay.context import RelayContext
from ci_relay.store.models import Change, Delivery, Run, Shard, TestResult, utcnow

Answer = tuple[int, dict[str, str], bytes]


def _json(status: int, data: Any, headers: dict[str, str] | None = None) -> Answer:
    return (
        status,
        {"content-type": "application/json", **(headers or {})},
        json.dumps(data).encode(),
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (a killed sender) is part of the tests


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Fake:
    """Shared machinery: the server thread, a request log, scripted answers, a hold gate."""

    max_body = 64 * 1024 * 1024

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.scripted: list[Answer] = []
        self.always: Answer | None = None
        self.hold: threading.Event | None = None  # requests wait here while it is unset
        self.arrived = threading.Event()

    # configuration --------------------------------------------------------------------
    def script(
        self, status: int, headers: dict[str, str] | None = None, body: Any = None, times: int = 1
    ) -> None:
        """Answer the next ``times`` requests with this, before behaving normally."""
        answer = _json(
            status, body if body is not None else {"message": f"scripted {status}"}, headers
        )
        with self.lock:
            self.scripted.extend([answer] * times)

    def fail_forever(self, status: int = 500, body: Any = None) -> None:
        self.always = _json(status, body if body is not None else {"message": "broken"})

    # serving --------------------------------------------------------------------------
    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        raise NotImplementedError

    def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        with self.lock:
            self.seen.append(Seen(method, path, headers, body))
        self.arrived.set()
        if self.hold is not None:
            self.hold.wait(60)
        with self.lock:
            if self.scripted:
                return self.scripted.pop(0)
            if self.always is not None:
                return self.always
        return self.answer(method, path, headers, body)

    @contextmanager
    def running(self) -> Iterator[str]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                length = int(headers.get("content-length") or 0)
                if length > fake.max_body:
                    status, out_headers, out = _json(
                        413, {"message": f"body over {fake.max_body} bytes"}
                    )
                    self.close_connection = True
                else:
                    body = self.rfile.read(length) if length else b""
                    status, out_headers, out = fake._dispatch(
                        self.command, self.path, headers, body
                    )
                self.send_response(status)
                for k, v in out_headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PATCH = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = _Server(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            if self.hold is not None:
                self.hold.set()
            server.shutdown()
            server.server_close()
            thread.join(10)

    def posts(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.method == "POST"]


# --- CRCR callback ------------------------------------------------------------------------


def workflow_problems(workflow: Any) -> list[str]:
    """The CRCR workflow format, checked by hand (not with the relay's own models)."""
    if not isinstance(workflow, dict):
        return ["workflow is not an object"]
    problems = []
    for key in (
        "schema_version",
        "status",
        "name",
        "run_id",
        "run_attempt",
        "job_name",
        "check_run_id",
    ):
        if key not in workflow:
            problems.append(f"workflow.{key} missing")
    if workflow.get("schema_version") != "1":
        problems.append("schema_version must be '1'")
    status = workflow.get("status")
    if status not in ("in_progress", "completed"):
        problems.append(f"bad status {status!r}")
    if status == "completed":
        if not workflow.get("conclusion") or not workflow.get("completed_at"):
            problems.append("completed needs conclusion and completed_at")
        counts = workflow.get("test_results") or {}
        if sorted(counts) != ["failed", "passed", "skipped", "total"]:
            problems.append(f"test_results keys {sorted(counts)}")
    elif not workflow.get("started_at"):
        problems.append("in_progress needs started_at")
    failed = workflow.get("failed_tests") or []
    if len(failed) > 1000:
        problems.append(f"{len(failed)} failed tests listed (max 1000)")
    for entry in failed:
        if len((entry.get("message") or "").encode()) > 1024:
            problems.append(f"message of {entry['name']} over 1 KB")
        if len((entry.get("stacktrace") or "").encode()) > 4096:
            problems.append(f"stacktrace of {entry['name']} over 4 KB")
    verdict = workflow.get("triage_verdict")
    if verdict is not None and len(json.dumps(verdict).encode()) > 16 * 1024:
        problems.append("triage_verdict over 16 KB")
    return problems


class CallbackReceiver(Fake):
    """The CRCR callback endpoint: a ``callback_payload`` with a valid ``workflow``."""

    def __init__(self, token: str | None = None) -> None:
        super().__init__()
        self.token = token
        self.accepted: list[dict[str, Any]] = []

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        if self.token and headers.get("authorization") != f"Bearer {self.token}":
            return _json(401, {"message": "bad credentials"})
        if not headers.get("content-type", "").startswith("application/json"):
            return _json(415, {"message": "json only"})
        try:
            data = json.loads(body)
        except ValueError:
            return _json(400, {"message": "not json"})
        missing = [k for k in ("event_type", "delivery_id", "payload", "workflow") if k not in data]
        problems = [f"{k} missing" for k in missing] or workflow_problems(data["workflow"])
        if problems:
            return _json(422, {"message": "; ".join(problems)})
        with self.lock:
            self.accepted.append(data)
        return _json(200, {"ok": True})


# --- HUD ----------------------------------------------------------------------------------

HUD_LIMIT = 2 * 1024 * 1024


class HudReceiver(Fake):
    """HUD's ``/crcr/results``: bot header, 2 MB, the trusted/untrusted shape, keyed records."""

    max_body = HUD_LIMIT

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token
        self.records: dict[str, dict[str, Any]] = {}
        self.sizes: list[int] = []

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        if headers.get("x-hud-internal-bot") != self.token:
            return _json(401, {"message": "unauthorized"})
        if len(body) > HUD_LIMIT:
            return _json(413, {"message": "too large"})
        data = json.loads(body)
        trusted, untrusted = data.get("trusted") or {}, data.get("untrusted") or {}
        callback = untrusted.get("callback_payload") or {}
        problems = [
            f"trusted.{k} missing"
            for k in ("verified_repo", "downstream_repo_level", "ci_metrics")
            if k not in trusted
        ] + workflow_problems(callback.get("workflow"))
        if problems:
            return _json(422, {"message": "; ".join(problems)})
        wf = callback["workflow"]
        key = "/".join(
            str(x)
            for x in (
                trusted["verified_repo"],
                callback["delivery_id"],
                wf["name"],
                wf["job_name"],
                wf["check_run_id"],
            )
        )
        with self.lock:
            self.records[key] = data
            self.sizes.append(len(body))
        return _json(200, {"key": key})


# --- GitHub -------------------------------------------------------------------------------


def rsa_key_pair() -> tuple[str, bytes]:
    """A fresh RSA key: (private PEM for the relay's settings, public PEM for the fake)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


@dataclass
class CheckRun:
    id: int
    repo: str
    head_sha: str
    name: str
    status: str
    conclusion: str | None = None
    output: dict[str, Any] = field(default_factory=dict)
    annotations: list[dict[str, Any]] = field(default_factory=list)


class FakeGitHub(Fake):
    """The endpoints the reporter uses, with GitHub's checks and limits."""

    def __init__(
        self, app_id: str, public_pem: bytes, installation_id: int = 77, token_lifetime: int = 3600
    ) -> None:
        super().__init__()
        self.app_id = app_id
        self.public_pem = public_pem
        self.installation_id = installation_id
        self.token_lifetime = token_lifetime
        self.tokens: dict[str, float] = {}  # token -> expiry (epoch)
        self.jwt_claims: list[dict[str, Any]] = []
        self.check_runs: dict[int, CheckRun] = {}
        self.statuses: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self.plain_token: str | None = None

    def _app_jwt(self, headers: dict[str, str]) -> str | None:
        """None if the bearer is a valid App JWT, else the error GitHub would give."""
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return "A JSON web token could not be decoded"
        try:
            claims = jwt.decode(
                auth[7:],
                self.public_pem,
                algorithms=["RS256"],
                options={"require": ["iat", "exp", "iss"]},
            )
        except jwt.PyJWTError as exc:
            return f"A JSON web token could not be decoded: {exc}"
        now = time.time()
        if claims["iat"] > now + 1:
            return "'Issued at' claim ('iat') must be an Integer representing a time in the past"
        if claims["exp"] - claims["iat"] > 600:
            return "'Expiration time' claim ('exp') is too far in the future"
        if str(claims["iss"]) != self.app_id:
            return "Integration not found"
        with self.lock:
            self.jwt_claims.append(claims)
        return None

    def _installation_token(self, headers: dict[str, str]) -> bool:
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            return False
        if self.plain_token is not None and token == self.plain_token:
            return True
        with self.lock:
            expiry = self.tokens.get(token)
        return expiry is not None and expiry > time.time()

    def _output_problem(self, output: dict[str, Any] | None) -> str | None:
        if output is None:
            return None
        for key in ("title", "summary"):
            if key not in output:
                return f"output.{key} is missing"
        for key in ("summary", "text"):
            if len(output.get(key) or "") > 65535:
                return f"output.{key} is too long (maximum is 65535 characters)"
        notes = output.get("annotations") or []
        if len(notes) > 50:
            return "output.annotations: only 50 annotations are allowed per request"
        for note in notes:
            for key in ("path", "start_line", "end_line", "annotation_level", "message"):
                if key not in note:
                    return f"annotation.{key} is missing"
            for key in ("message", "raw_details"):
                if len(str(note.get(key) or "").encode()) > 64 * 1024:
                    return f"annotation.{key} is too long (maximum is 64 kilobytes)"
        return None

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        parts = path.strip("/").split("/")
        data = json.loads(body) if body else {}
        if (
            method == "POST"
            and parts[:2] == ["app", "installations"]
            and parts[3:] == ["access_tokens"]
        ):
            error = self._app_jwt(headers)
            if error:
                return _json(401, {"message": error})
            if int(parts[2]) != self.installation_id:
                return _json(404, {"message": "Not Found"})
            token = "ghs_" + secrets.token_hex(16)
            expires = time.time() + self.token_lifetime
            with self.lock:
                self.tokens[token] = expires
            stamp = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            return _json(201, {"token": token, "expires_at": stamp})
        if method == "GET" and parts[0] == "repos" and parts[3:] == ["installation"]:
            error = self._app_jwt(headers)
            return (
                _json(401, {"message": error})
                if error
                else _json(200, {"id": self.installation_id})
            )
        if parts[0] != "repos" or len(parts) < 4:
            return _json(404, {"message": "Not Found"})
        if not self._installation_token(headers):
            return _json(401, {"message": "Bad credentials"})
        repo = f"{parts[1]}/{parts[2]}"
        if method == "POST" and parts[3:] == ["check-runs"]:
            if not data.get("name") or not data.get("head_sha"):
                return _json(422, {"message": "name and head_sha are required"})
            problem = self._output_problem(data.get("output"))
            if problem:
                return _json(422, {"message": problem})
            with self.lock:
                run = CheckRun(
                    len(self.check_runs) + 1,
                    repo,
                    data["head_sha"],
                    data["name"],
                    data.get("status", "queued"),
                )
                self.check_runs[run.id] = run
            self._apply(run, data)
            return _json(
                201, {"id": run.id, "html_url": f"https://github.test/{repo}/runs/{run.id}"}
            )
        if method == "PATCH" and parts[3] == "check-runs" and len(parts) == 5:
            run_ = self.check_runs.get(int(parts[4]))
            if run_ is None:
                return _json(404, {"message": "Not Found"})
            problem = self._output_problem(data.get("output"))
            if problem:
                return _json(422, {"message": problem})
            self._apply(run_, data)
            return _json(
                200, {"id": run_.id, "html_url": f"https://github.test/{repo}/runs/{run_.id}"}
            )
        if method == "POST" and parts[3] == "statuses" and len(parts) == 5:
            if data.get("state") not in ("error", "failure", "pending", "success"):
                return _json(422, {"message": "state is not valid"})
            if len(data.get("description") or "") > 140:
                return _json(
                    422, {"message": "description is too long (maximum is 140 characters)"}
                )
            key = (repo, parts[4], data.get("context") or "default")
            with self.lock:
                posted = self.statuses.setdefault(key, [])
                if len(posted) >= 1000:
                    return _json(
                        422,
                        {
                            "message": "This SHA and context has reached the maximum number of statuses."
                        },
                    )
                posted.append(data)
            return _json(201, {"state": data["state"], "context": key[2]})
        return _json(404, {"message": "Not Found"})

    def _apply(self, run: CheckRun, data: dict[str, Any]) -> None:
        with self.lock:
            run.status = data.get("status", run.status)
            run.conclusion = data.get("conclusion", run.conclusion)
            output = data.get("output")
            if output:
                run.annotations.extend(output.get("annotations") or [])
                run.output = {k: v for k, v in output.items() if k != "annotations"}

    def rate_limited_once(self, reset: int) -> None:
        self.script(
            403,
            {
                "x-ratelimit-remaining": "0",
                "x-ratelimit-reset": str(reset),
                "x-ratelimit-limit": "5000",
            },
            {"message": "API rate limit exceeded for installation ID 77."},
        )

    def token_requests(self) -> int:
        with self.lock:
            return sum(1 for s in self.seen if s.path.endswith("/access_tokens"))


# --- runs to report on ---------------------------------------------------------------------

PR_PAYLOAD_TEMPLATE: dict[str, Any] = {
    "action": "labeled",
    "number": 0,
    "pull_request": {"number": 0, "head": {"sha": ""}, "labels": []},
    "repository": {"full_name": ""},
}


def seed_run(
    rt: RelayContext,
    *,
    repository: str = "sample/pytorch",
    level: str = "L2",
    labels: tuple[str, ...] = (),
    number: int | None = 7,
    passed: int = 3,
    failures: int = 2,
    message: str = "AssertionError: 1 != 2",
    state: str = "running",
    backend: str = "cpu",
    details: str | None = None,
) -> int:
    """A delivery, change and run (one done shard with results), as the pipeline leaves them
    before ``collect``; returns the run id. Results go in with one multi-row insert."""
    sha = secrets.token_hex(20)
    payload = json.loads(json.dumps(PR_PAYLOAD_TEMPLATE))
    payload["number"] = payload["pull_request"]["number"] = number
    payload["pull_request"]["head"]["sha"] = sha
    payload["pull_request"]["labels"] = [{"name": label} for label in labels]
    payload["repository"]["full_name"] = repository
    with rt.db.session() as session:
        delivery = Delivery(
            source="github",
            hook_id="1",
            delivery_id=secrets.token_hex(8),
            event="pull_request",
            action="labeled",
            repository=repository,
            head_sha=sha,
            state="processed",
            headers={},
            body=json.dumps(payload).encode(),
        )
        change = Change(
            delivery=delivery,
            repository=repository,
            kind="pull_request" if number is not None else "push",
            number=number,
            head_sha=sha,
            labels=list(labels),
        )
        started = utcnow() - timedelta(minutes=3)
        run = Run(
            change=change,
            backend=backend,
            level=level,
            state=state,
            created_at=started - timedelta(seconds=20),
            started_at=started,
        )
        shard = Shard(run=run, index=0, test_files=[], state="done", exit_code=1 if failures else 0)
        session.add_all([delivery, change, run, shard])
        session.flush()
        rows = [
            {
                "shard_id": shard.id,
                "nodeid": f"test/test_ops.py::TestOpsCPU::test_ok_{i}",
                "outcome": "passed",
                "duration": 0.1,
            }
            for i in range(passed)
        ] + [
            {
                "shard_id": shard.id,
                "nodeid": f"test/test_ops.py::TestOpsCPU::test_bad_{i}",
                "outcome": "failed",
                "duration": 0.2,
                "message": message,
                "details": details,
            }
            for i in range(failures)
        ]
        if rows:
            session.execute(insert(TestResult), rows)
        return run.id


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/callback"


def wait_for(event: threading.Event, what: str, timeout: float = 60) -> None:
    if not event.wait(timeout):
        raise AssertionError(f"gave up waiting for {what}")
