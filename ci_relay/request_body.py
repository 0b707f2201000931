"""Reading a request body under a size limit, and its JSON, for every endpoint with uploads."""

from __future__ import annotations

import json
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
    if b"\\ud" in raw or b"\\uD" in raw:  # only an escape can produce a surrogate
        _refuse_surrogates(data)
    return data


def _refuse_surrogates(data: Any) -> None:
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            texts = [item]
        elif isinstance(item, dict):
            texts = list(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from (
                    None
                )
