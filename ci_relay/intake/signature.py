"""GitHub's ``X-Hub-Signature-256``: HMAC-SHA256 of the exact body bytes."""

from __future__ import annotations

import hashlib
import hmac


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Constant-time comparison; a missing or malformed header never verifies."""
    if not header or not header.startswith("sha256="):
        return False
    # as bytes: compare_digest refuses str with non-ASCII characters (a header may have them)
    return hmac.compare_digest(sign(secret, body).encode(), header.encode("utf-8", "replace"))
