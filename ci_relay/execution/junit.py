"""JUnit XML for results gathered across several processes (the shard runner's)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from ci_relay.execution.spec_run import TestOutcome

# characters XML 1.0 cannot hold; a traceback may carry them (terminal escapes, binary reprs)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def write_junit(path: Path, cases: list[TestOutcome], suite: str = "ci-relay") -> None:
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
        if case.mode or case.note:
            props = ET.SubElement(node, "properties")
            if case.mode:
                ET.SubElement(props, "property", name="reuse_spec.mode", value=case.mode)
            if case.note:
                ET.SubElement(props, "property", name="reuse_spec.note", value=_xml(case.note))
        message = _xml(case.message or "")
        details = _xml(case.details) if case.details else None
        if case.outcome in ("failed", "xpass_strict"):
            ET.SubElement(node, "failure", message=message).text = details
        elif case.outcome in ("error", "crashed"):
            ET.SubElement(node, "error", message=message, type=case.outcome).text = details
        elif case.outcome == "xfailed":
            ET.SubElement(node, "skipped", type="pytest.xfail", message=message)
        elif case.outcome == "skipped":
            ET.SubElement(node, "skipped", type="pytest.skip", message=message)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
