"""The relay's per-test coverage maps: recorded by the shards that run with the recorder on
(the nightly's by default, every run of ``coverage_backends``), stored one row per shard, and
read back, merged across the shards of the newest run that recorded one, when the selector
plans a change for the same repository and backend.

A shard whose recording is not a map (it recorded no test, or the shard failed: its tests
would look newer than the map) is not stored; the shard's row says why (the run page shows
it), and selections keep the previous map. A stored map that cannot be read (a damaged row,
a format this version does not know) is skipped with a warning: selection goes on with the
newest run whose rows can be read, and its notes say which and why.
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ci_relay.context import RelayContext
from ci_relay.store.models import Change, CoverageRecord, Run, Shard
from test_selection.coverage.map import CoverageMap, CoverageMapError, read_streams, refusal

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
    error: str | None = None,
) -> CoverageMap | None:
    """Read what the shard's test processes appended and store it as the shard's map
    (replacing an earlier attempt's). None, with the reason on the shard, when it is not a
    map (``coverage_map.refusal``; ``error``: why the shard failed, if it did)."""
    cmap, skipped = read_streams(streams, repository, revision, backend)
    if skipped:
        log.warning("shard %s: %d coverage record(s) unreadable, skipped", shard_id, skipped)
    problem = refusal(cmap, error)
    if problem:
        with rt.db.session() as session:
            shard = session.get(Shard, shard_id)
            if shard is None:
                return None
            kept = _newest_record(session, repository, backend, before_run=shard.run_id)
            shard.coverage_note = f"coverage map not kept: {problem}; " + (
                f"selections keep the map of run {kept.run_id} ({kept.revision[:12]})"
                if kept is not None
                else "there is no earlier map: selections rank without one"
            )
            session.execute(delete(CoverageRecord).where(CoverageRecord.shard_id == shard_id))
        log.warning("shard %s: %s", shard_id, problem)
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
        shard.coverage_note = (
            f"coverage map recorded: {len(cmap.tests)} test(s) over "
            f"{len(cmap.functions())} function(s)"
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


def _newest_record(
    session: Session, repository: str, backend: str, before_run: int | None = None
) -> CoverageRecord | None:
    query = select(CoverageRecord).where(
        CoverageRecord.repository == repository, CoverageRecord.backend == backend
    )
    if before_run is not None:
        query = query.where(CoverageRecord.run_id < before_run)
    return session.scalars(query.order_by(CoverageRecord.run_id.desc()).limit(1)).first()


@dataclass(frozen=True)
class MapChoice:
    """The map a selection ranks with, the run that recorded it, and what was passed over
    on the way to it (newer recordings that were refused or cannot be read)."""

    map: CoverageMap | None
    run_id: int | None
    notes: list[str]


LOOK_BACK = 5  # recording runs tried, newest first, before selecting without a map


def usable_map(rt: RelayContext, repository: str, backend: str) -> MapChoice:
    """The newest usable map of this repository on this backend (see the module
    docstring), and notes on the newer ones that were not."""
    notes: list[str] = []
    with rt.db.session() as session:
        runs = list(
            session.scalars(
                select(CoverageRecord.run_id)
                .where(CoverageRecord.repository == repository, CoverageRecord.backend == backend)
                .group_by(CoverageRecord.run_id)
                .order_by(CoverageRecord.run_id.desc())
                .limit(LOOK_BACK)
            )
        )
        newest = runs[0] if runs else 0
        refused = session.scalars(
            select(Shard)
            .join(Run, Shard.run_id == Run.id)
            .join(Change, Run.change_id == Change.id)
            .where(
                Change.repository == repository,
                Run.backend == backend,
                Shard.run_id > newest,
                Shard.coverage_note.like("coverage map not kept:%"),
            )
            .order_by(Shard.run_id.desc())
            .limit(1)
        ).first()
        if refused is not None and refused.coverage_note:
            notes.append(
                f"the newest coverage recording (run {refused.run_id}, shard "
                f"{refused.index}) was not kept: "
                + refused.coverage_note.removeprefix("coverage map not kept: ")
            )
    for run_id in runs:
        cmap = _run_map(rt, repository, backend, run_id)
        if cmap is not None:
            if notes or run_id != newest:
                notes.append(
                    f"ranking with the coverage map of run {run_id} ({cmap.revision[:12]})"
                )
            return MapChoice(cmap, run_id, notes)
        notes.append(f"the coverage map of run {run_id} cannot be read: skipped")
    return MapChoice(None, None, notes)


def newest_map(rt: RelayContext, repository: str, backend: str) -> CoverageMap | None:
    """The newest usable map of this repository on this backend, its shards merged (None
    when no run recorded one that can be read)."""
    return usable_map(rt, repository, backend).map


def _run_map(rt: RelayContext, repository: str, backend: str, run_id: int) -> CoverageMap | None:
    """One run's map, its shards merged (None when none of its rows can be read)."""
    with rt.db.session() as session:
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
