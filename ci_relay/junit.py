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


def write_junit(path: Path, cases: list[CaseResult], suite: str = "ci-relay") -> None:
    """JUnit XML (xunit2 shape) for results gathered outside one pytest session."""
    root = ET.Element("testsuites")
    failures = sum(c.outcome in ("failed", "xpass_strict") for c in cases)
    errors = sum(c.outcome in ("error", "crashed") for c in cases)
    skipped = sum(c.outcome in ("skipped", "xfailed") for c in cases)
    element = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(cases)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
    )
    for case in cases:
        classname, _, name = case.nodeid.rpartition("::")
        node = ET.SubElement(
            element,
            "testcase",
            classname=classname.replace("/", ".").replace("::", "."),
            name=name,
            time=f"{case.duration:.3f}",
        )
        if case.mode:
            props = ET.SubElement(node, "properties")
            ET.SubElement(props, "property", name="reuse_spec.mode", value=case.mode)
        message = case.message or ""
        if case.outcome in ("failed", "xpass_strict"):
            ET.SubElement(node, "failure", message=message)
        elif case.outcome in ("error", "crashed"):
            ET.SubElement(node, "error", message=message, type=case.outcome)
        elif case.outcome == "xfailed":
            ET.SubElement(node, "skipped", type="pytest.xfail", message=message)
        elif case.outcome == "skipped":
            ET.SubElement(node, "skipped", type="pytest.skip", message=message)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
