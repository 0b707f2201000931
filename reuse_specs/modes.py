"""The outcome modes a spec can give a test variant (torch-spyre's vocabulary)."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """What a test variant must do on the backend.

    ``mandatory_success`` must pass; ``xfail`` may fail (a pass is reported but
    tolerated); ``xfail_strict`` must fail (a pass fails the run); ``skip`` is
    never executed.
    """

    MANDATORY_SUCCESS = "mandatory_success"
    XFAIL = "xfail"
    XFAIL_STRICT = "xfail_strict"
    SKIP = "skip"


MODE_NAMES = ", ".join(m.value for m in Mode)
