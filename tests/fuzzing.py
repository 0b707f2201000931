"""Fuzzing the relay's untrusted inputs: Hypothesis strategies and the properties they must keep.

Shared by the bounded campaign in the test suite (``tests/test_fuzz.py``) and the longer one
in ``bench/fuzz.py``. Inputs start from real shapes (GitHub's payloads in
``tests/data/github``, the bundled reuse specs, a valid HUD body) and are mutated the ways
an attacker or a broken peer would: wrong types, deep nesting, huge strings, invalid UTF-8,
duplicate keys, lone surrogates, option-like and path-like strings, signatures over other
bytes. The properties: never a server error or a crash, a clear error, and no stored row for
a rejected request.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from sqlalchemy import func, select

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.intake.signature import sign
from ci_relay.store.models import AuditRecord, Change, CrcrResult, Delivery, Run

FIXTURES = Path(__file__).resolve().parent / "data" / "github"  # SOURCE.md there
SPECS = Path(__file__).resolve().parents[1] / "reuse_specs" / "specs"
from tests.relay_fixtures import DISPATCH_TOKEN, SECRET  # noqa: E402
from tests.test_reporting_ingest import BODY as HUD_BODY  # noqa: E402

HUD_TOKEN = "hud-token-for-fuzzing"
EVENTS = ("pull_request", "push", "check_run", "check_suite", "ping", "issues")
WEBHOOK_STATUSES = {200, 202, 400, 401, 413, 422}
DISPATCH_STATUSES = {202, 400, 401, 413, 422}
INGEST_STATUSES = {200, 201, 401, 413, 422}


def fixture_payloads() -> dict[str, list[dict[str, Any]]]:
    """GitHub's real payloads by event (octokit/webhooks examples)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(FIXTURES.glob("*/*.json")):
        out.setdefault(path.parent.name, []).append(json.loads(path.read_bytes()))
    return out


# --- values an attacker or a broken sender puts anywhere ----------------------------------

HOSTILE_STRINGS = [
    "--upload-pack=touch /tmp/ci-relay-pwned; git-upload-pack",
    "-c core.sshCommand=id",
    "$(id)",
    "`id`",
    "; rm -rf /",
    "../../../../etc/passwd",
    "refs/heads/../../x",
    "a..b",
    "x\ny",
    "\x00",
    "\ud800",
    "\u202e" + "a" * 10,
    "ec26c3e5",
    "E" * 40,
    "0" * 40,
    "f" * 64,
    "f" * 65,
    "${CI_RELAY_WEBHOOK_SECRET}",
]
odd_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
    st.sampled_from(HOSTILE_STRINGS),
    st.integers(min_value=1, max_value=20_000).map(lambda n: "y" * n),
)
json_values = st.recursive(
    odd_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=12), children, max_size=4),
    ),
    max_leaves=12,
)


def _paths(value: Any, max_depth: int = 12) -> list[tuple[Any, ...]]:
    """Positions in a JSON document (dict keys and list indexes), down to ``max_depth``."""
    out: list[tuple[Any, ...]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        prefix, node = stack.pop()
        out.append(prefix)
        if len(prefix) >= max_depth:
            continue
        if isinstance(node, dict):
            stack += [((*prefix, key), child) for key, child in node.items()]
        elif isinstance(node, list):
            stack += [((*prefix, index), child) for index, child in enumerate(node)]
    return sorted(out, key=lambda p: (len(p), [str(k) for k in p]))


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], max_mutations: int = 4) -> Any:
    """``base`` with a few positions replaced by odd values, deleted, or nested deeply."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=max_mutations))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["replace", "replace", "delete", "nest", "hostile"]))
        if how == "delete" and path:
            doc = _set(doc, path, None, delete=True)
        elif how == "nest":
            depth = draw(st.integers(min_value=50, max_value=600))  # deeper: raw_bodies
            value: Any = "deep"
            for _ in range(depth):
                value = [value]
            doc = _set(doc, path, value)
        elif how == "hostile":
            doc = _set(doc, path, draw(st.sampled_from(HOSTILE_STRINGS)))
        else:
            doc = _set(doc, path, draw(json_values))
        if not isinstance(doc, dict | list):
            break
    return doc


def _dumps(value: Any) -> bytes:
    # allow_nan: NaN/Infinity are not JSON, but senders emit them; ensure_ascii off keeps
    # lone surrogates as they are, which utf-8 cannot encode: surrogatepass writes them raw
    text = json.dumps(value, allow_nan=True, ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def raw_bodies(draw: st.DrawFn, value: Any) -> bytes:
    """The bytes a sender puts on the wire for ``value``, sometimes broken on purpose."""
    body = _dumps(value)
    how = draw(
        st.sampled_from(
            [
                "plain",
                "plain",
                "plain",
                "escaped",
                "duplicate-key",
                "bad-utf8",
                "cut",
                "bom",
                "deep",
            ]
        )
    )
    if how == "escaped":
        return json.dumps(value, allow_nan=True).encode()  # \\ud800 escapes, not raw bytes
    if how == "duplicate-key" and body.startswith(b"{") and len(body) > 2:
        return b'{"action": "opened", "repository": {"full_name": "a/b"}, ' + body[1:]
    if how == "bad-utf8":
        at = draw(st.integers(min_value=0, max_value=len(body)))
        return body[:at] + b"\xff\xfe" + body[at:]
    if how == "cut":
        return body[: draw(st.integers(min_value=0, max_value=max(0, len(body) - 1)))]
    if how == "bom":
        return b"\xef\xbb\xbf" + body
    if how == "deep":  # past any recursion limit, as text (json.dumps itself would recurse)
        depth = draw(st.integers(min_value=900, max_value=60_000))
        return b'{"a":' * depth + body + b"}" * depth
    return body


@st.composite
def webhook_requests(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    """(headers, body) of a POST /webhooks/github, signed (mostly) over its own bytes."""
    payloads = fixture_payloads()
    event = draw(st.sampled_from(EVENTS))
    base = draw(st.sampled_from(payloads.get(event) or payloads["pull_request"]))
    value = draw(st.one_of(mutated(base), mutated(base), json_values))
    body = draw(raw_bodies(value))
    signed = draw(st.sampled_from(["own", "own", "own", "other", "none", "garbage"]))
    headers = {
        "X-GitHub-Event": draw(st.one_of(st.just(event), st.sampled_from(HOSTILE_STRINGS[:6]))),
        "X-GitHub-Delivery": draw(
            st.one_of(st.uuids().map(str), st.text(max_size=140), st.sampled_from(["", "a b"]))
        ),
        "X-GitHub-Hook-ID": draw(st.sampled_from(["4242", "", "x", "9" * 30])),
        "Content-Type": "application/json",
    }
    if signed == "own":
        headers["X-Hub-Signature-256"] = sign(SECRET, body)
    elif signed == "other":
        headers["X-Hub-Signature-256"] = sign(SECRET, body + b" ")
    elif signed == "garbage":
        headers["X-Hub-Signature-256"] = draw(st.text(max_size=80))
    # headers are latin-1 on the wire; drop what cannot be sent at all
    return {k: v for k, v in headers.items() if _sendable(v)}, body


def wire_headers(headers: dict[str, str]) -> dict[str, bytes]:
    """Header values as the bytes sent (an HTTP client would refuse non-ASCII text)."""
    return {k: v.encode("latin-1") for k, v in headers.items()}


def _sendable(value: str) -> bool:
    return not re.search(r"[\r\n\x00]", value) and all(ord(c) < 256 for c in value)


@st.composite
def dispatch_requests(draw: st.DrawFn) -> bytes:
    payloads = fixture_payloads()
    event = draw(st.sampled_from(["pull_request", "push", "check_run"]))
    payload = draw(st.sampled_from(payloads[event]))
    envelope: dict[str, Any] = {"event_type": event, "delivery_id": "crcr-1", "payload": payload}
    if draw(st.booleans()):
        envelope = {"action": "crcr", "client_payload": envelope}
    return draw(raw_bodies(draw(st.one_of(mutated(envelope), json_values))))


# a completed result in HUD's format (the ingest tests' in_progress one, finished)
VALID_HUD_BODY: dict[str, Any] = copy.deepcopy(HUD_BODY)
VALID_HUD_BODY["untrusted"]["callback_payload"]["workflow"].update(
    status="completed",
    conclusion="success",
    test_results={"passed": 1, "failed": 0, "skipped": 0, "total": 1},
)


@st.composite
def hud_bodies(draw: st.DrawFn) -> bytes:
    return draw(raw_bodies(draw(st.one_of(mutated(VALID_HUD_BODY, 6), json_values))))


# --- spec files -------------------------------------------------------------------------

YAML_PIECES = [
    "test_suite_config:\n",
    "  files:\n",
    "    - path: ${TORCH_ROOT}/test/test_x.py\n",
    "      unlisted_test_mode: xfail\n",
    "      tests:\n",
    "        - names: [TestX::test_a]\n",
    "          mode: mandatory_success\n",
    "  global:\n",
    "    supported_dtypes: [{name: float16}]\n",
    "&a [1, 2, *a]\n",
    "x: &anchor {k: v}\ny: *anchor\n",
    "<<: *undefined\n",
    "!!python/object/apply:os.system ['id']\n",
    "!!binary aGVsbG8=\n",
    "!custom tag\n",
    "? [complex, key]\n: value\n",
    "key: key\nkey: again\n",
    "\t- tab\n",
    "- [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]\n",
    "%YAML 1.1\n---\n",
    "...\n---\n",
    "'unterminated\n",
    "{a: 1, b: [2, {c: 3}]}\n",
    "!!int 0x1F\n",
    "~\n",
    ".inf\n",
    "0o777\n",
    "2026-11-30\n",
    "\ufeff",
    "\x00",
    "\x85",
    "${CI_RELAY_WEBHOOK_SECRET}\n",
    "    - path: ${HOME}/x.py\n",
]


def _laughs(depth: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, depth):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@st.composite
def spec_texts(draw: st.DrawFn) -> str:
    """YAML text: a bundled spec with splices, token soup, dumped odd data, alias bombs."""
    bundled = [p.read_text(encoding="utf-8") for p in sorted(SPECS.glob("*.yaml"))]
    how = draw(st.sampled_from(["splice", "soup", "dump", "bomb", "deep"]))
    if how == "splice":
        text = draw(st.sampled_from(bundled))
        for _ in range(draw(st.integers(min_value=1, max_value=3))):
            at = draw(st.integers(min_value=0, max_value=len(text)))
            text = text[:at] + draw(st.sampled_from(YAML_PIECES)) + text[at:]
        return text
    if how == "soup":
        return "".join(draw(st.lists(st.sampled_from(YAML_PIECES), max_size=12)))
    if how == "dump":
        import yaml

        doc = {"test_suite_config": draw(json_values)}
        return yaml.safe_dump(doc, allow_unicode=True) if _dumpable(doc) else "x: 1\n"
    if how == "bomb":
        return _laughs(draw(st.integers(min_value=2, max_value=9)))
    depth = draw(st.integers(min_value=10, max_value=5000))
    return "test_suite_config: " + "[" * depth + "]" * depth + "\n"


def _dumpable(doc: Any) -> bool:
    try:
        json.dumps(doc).encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return False
    return True


SPEC_ERROR_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): error: .+", re.S)


# --- properties ---------------------------------------------------------------------------


def row_counts(rt: RelayContext) -> dict[str, int]:
    with rt.db.session() as session:
        return {
            model.__tablename__: session.scalar(select(func.count()).select_from(model)) or 0
            for model in (Delivery, Change, Run, AuditRecord, CrcrResult)
        }


@dataclass
class Tally:
    """What a campaign saw: cases by HTTP status (or outcome), and failures with an example."""

    cases: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> None:
        self.cases += 1
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1


def check_webhook(
    post: Callable[..., Any], rt: RelayContext, headers: dict[str, str], body: bytes, tally: Tally
) -> None:
    """One webhook: an expected status, rows only for an accepted delivery, and a stored
    delivery that the pipeline can process without raising."""
    before = row_counts(rt)
    response = post("/webhooks/github", content=body, headers=wire_headers(headers))
    tally.count(str(response.status_code))
    assert response.status_code in WEBHOOK_STATUSES, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    after = row_counts(rt)
    if response.status_code >= 400:
        assert response.json()["error"], response.text
        for table in ("deliveries", "changes", "runs"):
            assert after[table] == before[table], (table, response.text)
        return
    data = response.json()
    if response.status_code == 200:  # ping: recorded once per delivery id
        assert data["pong"] is True
        assert after["deliveries"] - before["deliveries"] in (0, 1)
        return
    if data.get("duplicate") or (data.get("state") == "ignored" and "id" not in data):
        assert after["deliveries"] == before["deliveries"]
        return
    assert after["deliveries"] == before["deliveries"] + 1, response.text
    with rt.db.session() as session:
        row = session.scalars(select(Delivery).order_by(Delivery.id.desc())).first()
        assert row is not None and row.body == body  # the raw bytes, as received
        pk = row.id
    pipeline.process_delivery(rt, pk)  # must not raise on anything intake accepted


def check_dispatch(post: Callable[..., Any], rt: RelayContext, body: bytes, tally: Tally) -> None:
    before = row_counts(rt)
    response = post(
        "/webhooks/dispatch",
        content=body,
        headers={"Authorization": f"Bearer {DISPATCH_TOKEN}", "Content-Type": "application/json"},
    )
    tally.count(str(response.status_code))
    assert response.status_code in DISPATCH_STATUSES, (response.status_code, response.text)
    after = row_counts(rt)
    if response.status_code >= 400:
        assert response.json()["error"]
        assert after["deliveries"] == before["deliveries"], response.text
        return
    with rt.db.session() as session:
        newest = session.scalars(select(Delivery).order_by(Delivery.id.desc())).first()
        if newest is not None and newest.source == "dispatch" and newest.body == body:
            pipeline.process_delivery(rt, newest.id)


def check_ingest(post: Callable[..., Any], rt: RelayContext, body: bytes, tally: Tally) -> None:
    before = row_counts(rt)
    response = post(
        "/api/crcr/results",
        content=body,
        headers={"x-hud-internal-bot": HUD_TOKEN, "Content-Type": "application/json"},
    )
    tally.count(str(response.status_code))
    assert response.status_code in INGEST_STATUSES, (response.status_code, response.text)
    after = row_counts(rt)
    if response.status_code >= 400:
        assert response.json()["error"]
        assert after["crcr_results"] == before["crcr_results"], response.text


def check_spec_text(text: str, folder: Path, upstream: Path, tally: Tally) -> None:
    """A spec file loads, or fails with ``FILE:LINE:COL: error: ...`` lines; nothing else."""
    from reuse_specs import SpecErrors, load_specs

    path = folder / "fuzz.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        load_specs([path], upstream)
    except SpecErrors as exc:
        tally.count("errors")
        assert exc.errors, "SpecErrors without an error"
        for error in exc.errors:
            match = SPEC_ERROR_LINE.match(str(error))
            assert match and match["file"] == str(path), str(error)
            assert int(match["line"]) >= 1 and int(match["col"]) >= 1, str(error)
        return
    tally.count("valid")
