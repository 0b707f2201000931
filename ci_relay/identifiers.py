"""Identifiers that come from outside (webhooks, dispatch envelopes, stored rows, the CLI).

Every value here ends up in a git argument, a file or folder name, a queue name, a URL
or a fixed-width database column, so each is checked against a strict shape at the edge
and again where it is used. The shapes follow what GitHub and git themselves allow; a
value outside them is refused with a message naming what was expected, never repaired.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, WithJsonSchema

# a commit id: SHA-1 (40) or SHA-256 (64) repositories, lowercase as git and GitHub print it
_COMMIT = re.compile(r"(?:[0-9a-f]{40}|[0-9a-f]{64})")
# owner: GitHub's user/org names (39 chars, no leading hyphen); name: letters, digits, . _ -
_REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}")
_DELIVERY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_EVENT = re.compile(r"[a-z][a-z0-9_]{0,63}")
_HOOK_ID = re.compile(r"[0-9]{1,20}")
# what git check-ref-format refuses anywhere in a ref
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PRINTABLE_ACTION = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,63}")

MAX_REF_LENGTH = 255
MAX_LABEL_LENGTH = 100  # GitHub allows 50; room for other forges, still far below the column
MAX_LABELS = 100
MAX_PR_NUMBER = 2**31 - 1  # the column is a 32-bit integer


class InvalidIdentifier(ValueError):
    """A value from outside that does not have the shape its field requires."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _encodable(value: str) -> bool:
    """Valid UTF-8 once encoded (JSON escapes can smuggle in lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def commit_id(value: str) -> str:
    if not isinstance(value, str) or not _COMMIT.fullmatch(value):
        raise InvalidIdentifier(f"not a commit id (40 or 64 lowercase hex digits): {_shown(value)}")
    return value


def repository_name(value: str) -> str:
    if not isinstance(value, str) or not _REPOSITORY.fullmatch(value):
        raise InvalidIdentifier(f"not a repository name (owner/name): {_shown(value)}")
    name = value.split("/", 1)[1]
    if name in (".", ".."):
        raise InvalidIdentifier(f"not a repository name (owner/name): {_shown(value)}")
    return value


def git_ref(value: str) -> str:
    """A branch, tag or full ref name as ``git check-ref-format`` accepts it."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_REF_LENGTH
        or _REF_FORBIDDEN.search(value)
        or value.startswith(("-", "/", "."))
        or value.endswith(("/", ".", ".lock"))
        or value == "@"
        or any(part.startswith(".") or part.endswith(".lock") for part in value.split("/"))
    ):
        raise InvalidIdentifier(f"not a git ref name: {_shown(value)}")
    return value


def label_name(value: str) -> str:
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > MAX_LABEL_LENGTH
        or _CONTROL.search(value)
        or not _encodable(value)
    ):
        raise InvalidIdentifier(
            f"not a label (1-{MAX_LABEL_LENGTH} printable characters): {_shown(value)}"
        )
    return value


def delivery_id(value: str) -> str:
    if not isinstance(value, str) or not _DELIVERY_ID.fullmatch(value):
        raise InvalidIdentifier(
            "not a delivery id (1-128 letters, digits, '.', '_', ':' or '-'): " + _shown(value)
        )
    return value


def event_name(value: str) -> str:
    if not isinstance(value, str) or not _EVENT.fullmatch(value):
        raise InvalidIdentifier(f"not an event name (lowercase, digits, '_'): {_shown(value)}")
    return value


def hook_id(value: str) -> str:
    if not isinstance(value, str) or not _HOOK_ID.fullmatch(value):
        raise InvalidIdentifier(f"not a hook id (digits): {_shown(value)}")
    return value


def is_printable_action(value: object) -> bool:
    """An event's action worth storing as is (1-64 printable ASCII characters); the actions
    the relay acts on are checked strictly, others (repository_dispatch types) just kept."""
    return isinstance(value, str) and bool(_PRINTABLE_ACTION.fullmatch(value))


def is_commit_id(value: str) -> bool:
    return bool(_COMMIT.fullmatch(value))


def is_repository_name(value: str) -> bool:
    try:
        repository_name(value)
    except InvalidIdentifier:
        return False
    return True


# the shapes as JSON schema patterns (what the OpenAPI schema documents)
COMMIT_PATTERN = "^" + _COMMIT.pattern + "$"
REPOSITORY_PATTERN = "^" + _REPOSITORY.pattern + "$"
DELIVERY_ID_PATTERN = "^" + _DELIVERY_ID.pattern + "$"
EVENT_PATTERN = "^" + _EVENT.pattern + "$"
HOOK_ID_PATTERN = "^" + _HOOK_ID.pattern + "$"


def _documented(pattern: str) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": pattern})


# pydantic field types: validation errors carry the messages above and the field's path
CommitId = Annotated[str, AfterValidator(commit_id), _documented(COMMIT_PATTERN)]
RepositoryName = Annotated[str, AfterValidator(repository_name), _documented(REPOSITORY_PATTERN)]
GitRef = Annotated[str, AfterValidator(git_ref)]
LabelName = Annotated[str, AfterValidator(label_name)]
DeliveryId = Annotated[str, AfterValidator(delivery_id), _documented(DELIVERY_ID_PATTERN)]
EventName = Annotated[str, AfterValidator(event_name), _documented(EVENT_PATTERN)]
ActionName = Annotated[str, AfterValidator(event_name), _documented(EVENT_PATTERN)]
PullRequestNumber = Annotated[int, Field(ge=1, le=MAX_PR_NUMBER)]
