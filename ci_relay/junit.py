"""JUnit XML (pytest, xunit2) -> one typed row per test case."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CaseResult:
    nodeid: str
    outcome: str  # passed | failed | error | skipped | xfailed
    mode: str | None
    duration: float
    message: str | None


def parse_junit(path: Path) -> list[CaseResult]:
    results = []
    for case in ET.parse(path).iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcome, message = "passed", None
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = (
                    ("failed" if child.tag == "failure" else "error"),
                    child.get("message"),
                )
            elif child.tag == "skipped":
                kind = child.get("type", "")
                outcome = "xfailed" if kind == "pytest.xfail" else "skipped"
                message = child.get("message")
        results.append(
            CaseResult(
                nodeid=f"{classname}::{name}" if classname else name,
                outcome=outcome,
                mode=props.get("reuse_spec.mode"),
                duration=float(case.get("time") or 0.0),
                message=(message or None) and message[:4096],
            )
        )
    return results
