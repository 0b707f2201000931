"""Cutting a long text to a byte budget while keeping its head and its tail.

A failure's text starts with the test's own frame and ends with the error that
broke it, so the middle is what a reader misses least. The shard side (64 KB per
test) and the reporters (4 KB per CRCR stacktrace) cut the same way, and the cut
says how much went missing, so nobody mistakes an excerpt for the whole text.
"""

from __future__ import annotations

SNAP_BYTES = 256  # a cut moves to a line break when one is this close: whole lines read better


def _mark(cut: int) -> bytes:
    return f"\n…[{cut} bytes cut]…\n".encode()


def head_and_tail(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes: its start and its end, the cut marked."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    room = limit - len(_mark(len(data)))  # the mark never gets longer than this one
    if room < 2:
        return data[:limit].decode("utf-8", "ignore")
    head, tail = data[: room // 2], data[len(data) - (room - room // 2) :]
    newline = head.rfind(b"\n")
    if newline >= max(0, len(head) - SNAP_BYTES):
        head = head[: newline + 1]
    newline = tail.find(b"\n")
    if 0 <= newline < SNAP_BYTES:
        tail = tail[newline + 1 :]
    start = head.decode("utf-8", "ignore").rstrip("\n")
    end = tail.decode("utf-8", "ignore")
    cut = len(data) - len(start.encode()) - len(end.encode())
    return start + _mark(cut).decode() + end
