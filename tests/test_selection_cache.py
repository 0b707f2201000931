"""The selector's on-disk caches under concurrent writers: two selections in one worker
process (threads, one pid) store the same entries at the same time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from test_selection.inventory import InventoryCache


def test_threads_of_one_process_store_the_same_entry_at_once(tmp_path: Path) -> None:
    cache = InventoryCache(tmp_path / "cache")

    def store(i: int) -> None:
        cache.store("blob", "ab" * 20, {"writer": i % 2, "payload": "x" * 4096})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(store, range(400)))  # raised FileNotFoundError with per-pid temp names
    assert cache.load("blob", "ab" * 20) in (
        {"writer": 0, "payload": "x" * 4096},
        {"writer": 1, "payload": "x" * 4096},
    )
    leftovers = [p.name for p in (tmp_path / "cache").rglob("*") if ".tmp" in p.name]
    assert leftovers == []
