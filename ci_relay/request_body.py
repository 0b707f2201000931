"""Reading a request body under a size limit, shared by every endpoint that takes uploads."""

from __future__ import annotations

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
