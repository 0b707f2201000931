"""The relay's per-test coverage maps: recorded by the shards that run with the recorder on
(the nightly's by default, every run of ``coverage_backends``), stored one row per shard, and
read back, merged across the shards of the newest run that recorded one, when the selector
plans a change for the same repository and backend.

A map that cannot be read (a damaged row, a format this version does not know) is skipped
with a warning: selection goes on with the rows that can, or without a map; the next nightly
records a new one.
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import delete, select

from ci_relay.context import RelayContext
from ci_relay.store.models import CoverageRecord, Shard
from test_selection.coverage_map import CoverageMap, CoverageMapError, read_streams

log = logging.getLogger("ci_relay.coverage")

MAP_CACHE = 4  # merged maps kept in this process (a selection loads one per backend)


def records_coverage(rt: RelayContext, kind: str, backend: str) -> bool:
    """Whether a shard of a run of this kind on this backend records a map."""
    settings = rt.settings
    return (kind == "nightly" and settings.coverage_nightly) or (
        backend in settings.coverage_backends
    )


def store_shard_map(
    rt: RelayContext,
    shard_id: int,
    streams: list[Path],
    repository: str,
    revision: str,
    backend: str,
) -> CoverageMap | None:
    """Read what the shard's test processes appended and store it as the shard's map
    (replacing an earlier attempt's). None when they recorded no test."""
    cmap, skipped = read_streams(streams, repository, revision, backend)
    if skipped:
        log.warning("shard %s: %d coverage record(s) unreadable, skipped", shard_id, skipped)
    if not cmap.tests:
        return None
    data = gzip.compress(
        json.dumps(cmap.to_json(), separators=(",", ":")).encode(), compresslevel=6
    )
    with rt.db.session() as session:
        shard = session.get(Shard, shard_id)
        if shard is None:
            return None
        session.execute(delete(CoverageRecord).where(CoverageRecord.shard_id == shard_id))
        session.add(
            CoverageRecord(
                shard_id=shard_id,
                run_id=shard.run_id,
                repository=repository,
                backend=backend,
                revision=revision,
                tests=len(cmap.tests),
                functions=len(cmap.functions()),
                data=data,
            )
        )
    log.info(
        "shard %s: coverage of %d test(s) over %d function(s) stored (%d KB)",
        shard_id,
        len(cmap.tests),
        len(cmap.functions()),
        len(data) // 1024,
    )
    return cmap


@dataclass(frozen=True)
class _Key:
    database: str
    repository: str
    backend: str
    run_id: int
    rows: tuple[int, ...]  # a shard's new attempt replaces its row: a new id


_cache: dict[_Key, CoverageMap] = {}


def forget_cached_maps() -> None:
    """Drop the merged maps this process keeps (rows are never changed in place; a test
    that damages one does)."""
    _cache.clear()


def newest_map(rt: RelayContext, repository: str, backend: str) -> CoverageMap | None:
    """The newest run's map of this repository on this backend, its shards merged (None
    when no run recorded one, or none of its rows can be read)."""
    with rt.db.session() as session:
        run_id = session.scalars(
            select(CoverageRecord.run_id)
            .where(CoverageRecord.repository == repository, CoverageRecord.backend == backend)
            .order_by(CoverageRecord.run_id.desc())
            .limit(1)
        ).first()
        if run_id is None:
            return None
        ids = tuple(
            session.scalars(
                select(CoverageRecord.id)
                .where(CoverageRecord.run_id == run_id, CoverageRecord.backend == backend)
                .order_by(CoverageRecord.id)
            )
        )
        key = _Key(rt.db.url, repository, backend, run_id, ids)
        if key in _cache:
            return _cache[key]
        merged: CoverageMap | None = None
        for row_id in ids:
            row = session.get(CoverageRecord, row_id)
            assert row is not None
            try:
                cmap = CoverageMap.from_json(
                    json.loads(gzip.decompress(row.data)), source=f"coverage map {row_id}"
                )
                if merged is None:
                    merged = cmap
                else:
                    merged.merge(cmap)
            except (CoverageMapError, OSError, EOFError, ValueError) as exc:
                log.warning(
                    "coverage map of shard %s (run %s) ignored: %s", row.shard_id, run_id, exc
                )
    if merged is not None:
        while len(_cache) >= MAP_CACHE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = merged
    return merged
