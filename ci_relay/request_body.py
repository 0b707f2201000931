"""Reading a request body under a size limit, and its JSON, for every endpoint with uploads."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request


class BodyTooLarge(Exception):
    pass


async def read_body_at_most(request: Request, limit: int) -> bytes:
    """The body, refusing early (without buffering it all) when it passes ``limit``.

    A Content-Length over the limit is refused at once; the streamed size is counted too,
    since a declared length is only a hint (chunked bodies have none).
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


# the escapes that matter for surrogates: ``\\uDxxx``, and ``\\\\`` (an escaped backslash,
# consumed whole, so that in ``\\\\ud800`` the ``ud800`` is text); a regex scan, because
# even a plain ``in`` test over a large body costs more than this
_ESCAPE = re.compile(rb"\\(?:\\|u([dD][0-9a-fA-F]{3}))")


def parse_json(raw: bytes) -> Any:
    """A request body's JSON, refusing with ``ValueError`` what must not reach the database.

    Besides syntax and encoding: nesting deeper than the parser's recursion limit
    (``RecursionError`` becomes ``ValueError``), integers too long to convert (Python's own
    limit raises ``ValueError``), and lone UTF-16 surrogates written as ``\\ud8xx``
    escapes, which are valid JSON syntax but no Unicode text (PostgreSQL refuses them).
    """
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if _lone_surrogate(raw):
        raise ValueError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)")
    return data


def _lone_surrogate(raw: bytes) -> bool:
    """Whether a valid JSON text escapes a surrogate that is not half of a pair: a high one
    (D800-DBFF) right before a low one (DC00-DFFF) is a character; any other is not."""
    pending_high = -1  # end offset of an unpaired high surrogate escape
    for match in _ESCAPE.finditer(raw):
        code = int(match.group(1), 16) if match.group(1) else -1
        if pending_high >= 0:
            if match.start() == pending_high and 0xDC00 <= code <= 0xDFFF:
                pending_high = -1
                continue
            return True  # a high surrogate without its low half
        if 0xD800 <= code <= 0xDBFF:
            pending_high = match.end()
        elif 0xDC00 <= code <= 0xDFFF:
            return True  # a low surrogate alone
    return pending_high >= 0
