"""A job whose worker died is taken over after its heartbeat has stopped for
CI_RELAY_CLAIM_STALE_SECONDS, not after the broker's visibility timeout (issue 27, item 2:
bench/bench_compose.py killed an exec worker mid-shard, and with the default four-hour
visibility timeout its shard would have waited four hours)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from ci_relay import pipeline
from ci_relay.sample_upstream import SampleUpstream
from ci_relay.service import tasks
from ci_relay.settings import Settings
from ci_relay.store.models import Change, Delivery, Run, Shard, ShardState, utcnow
from tests.relay_fixtures import upstream_context

SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_view_ops.py
"""


def test_a_shard_without_heartbeat_is_taken_over_long_before_the_visibility_timeout(
    sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    rt = upstream_context(
        tmp_path,
        sample_upstream.path,
        SPEC,
        task_visibility_timeout=4 * 3600,
        claim_stale_seconds=30,
    )
    now = utcnow()
    with rt.db.session() as s:
        delivery = Delivery(
            source="github", delivery_id="stale-1", event="push", hook_id="1", body=b"{}"
        )
        change = Change(
            delivery=delivery, repository="sample/pytorch", kind="push", head_sha="a" * 40
        )
        run = Run(change=change, backend="cpu", level="L2", state="running")
        beating = Shard(run=run, index=0, test_files=[], state=ShardState.RUNNING)
        silent = Shard(run=run, index=1, test_files=[], state=ShardState.RUNNING)
        s.add_all([delivery, change, run, beating, silent])
        s.flush()
        beating.updated_at = now - timedelta(seconds=5)  # its worker beats every 7.5 s
        silent.updated_at = now - timedelta(seconds=60)  # its worker was killed a minute ago
        ids = {"beating": beating.id, "silent": silent.id}
    tasks.configure(rt.settings)
    try:
        stale, silent = tasks._stale(), tasks._silent()
        steps = pipeline.reconcile(
            rt, older_than=timedelta(seconds=60), stale_after=stale, silent_after=silent
        )
    finally:
        tasks.configure(Settings())
    assert silent == timedelta(seconds=30)
    assert stale == timedelta(hours=4)  # a selection has no heartbeat: the broker's timeout
    again = {step.arg for step in steps if step.task == "execute"}
    assert again == {ids["silent"]}
    # never later than the broker would give the message back on its own
    assert Settings(task_visibility_timeout=20).claim_stale_seconds == 600
    tasks.configure(Settings(task_visibility_timeout=20))
    try:
        assert tasks._silent() == timedelta(seconds=20)
    finally:
        tasks.configure(Settings())
