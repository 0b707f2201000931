"""The pipeline through a real Redis broker, real Celery workers and PostgreSQL.

Each test gets its own Redis database number and PostgreSQL database; workers
are real ``ci-relay worker`` processes that run the sample upstream's tests.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from ci_relay.context import RelayContext
from ci_relay.demo import pull_request_payload
from ci_relay.intake.signature import sign
from ci_relay.sample_upstream import SampleCommit, SampleUpstream
from ci_relay.settings import Settings
from ci_relay.store.models import Delivery, OutboxMessage, Run, Selection, Shard, TestResult
from tests.conftest import worker_index
from tests.relay_fixtures import SECRET, fresh_postgres_database

# one xdist worker for the whole module: a test here restarts the Redis server, which would
# cut off the brokers of pipeline tests running beside it on other workers (Celery then stops
# consuming: "Unrecoverable error" on reconnecting)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real-redis")]

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_START = [
    "redis-server",
    "--daemonize",
    "yes",
    "--bind",
    "127.0.0.1",
    "-::1",
    "--port",
    "6379",
    "--save",
    "",
    "--appendonly",
    "no",
    "--dir",
    "/var/lib/redis",
    "--logfile",
    "/var/log/redis/ci.log",
]
SMALL_SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_view_ops.py
      unlisted_test_mode: mandatory_success
"""


def _wait(
    predicate: Callable[[], bool], timeout: float, what: str, cluster: Cluster | None = None
) -> None:
    """Wait for the predicate; on timeout, fail with the cluster's logs as they are then,
    each live worker's thread stacks included (a stuck worker shows where it is)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    logs = f"\n{cluster.logs_with_stacks()}" if cluster is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{logs}")


_DATABASES = itertools.count()


def redis_database() -> int:
    """A Redis database number no other xdist worker uses at the same time (1..15 split
    between workers, taken in turn; database 0 stays free for people)."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    per_worker = max(1, 15 // workers)
    return 1 + worker_index() * per_worker + next(_DATABASES) % per_worker


class Cluster:
    """Settings shared by the API side (this process) and worker subprocesses."""

    def __init__(self, tmp: Path, database_url: str, sample: SampleUpstream) -> None:
        self.db_number = redis_database()
        redis.Redis(REDIS_HOST, REDIS_PORT, db=self.db_number).flushdb()
        spec = tmp / "small.yaml"
        spec.write_text(SMALL_SPEC)
        policy = tmp / "policy.yaml"
        policy.write_text(
            "repositories:\n  sample/pytorch:\n    backends:\n      cpu: {level: L2}\n"
        )
        self.env = {
            "CI_RELAY_DATABASE_URL": database_url,
            "CI_RELAY_BROKER_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{self.db_number}",
            "CI_RELAY_DATA_DIR": str(tmp / "data"),
            "CI_RELAY_WEBHOOK_SECRET": SECRET,
            "CI_RELAY_POLICY_FILE": str(policy),
            "CI_RELAY_UPSTREAM_REPO": str(sample.path),
            "CI_RELAY_SPECS": json.dumps([str(spec)]),
            "CI_RELAY_TASK_VISIBILITY_TIMEOUT": "20",
            "CI_RELAY_RECONCILE_AFTER_SECONDS": "2",
            "CI_RELAY_SELECTION_AGENT": "none",
        }
        self.tmp = tmp
        self.sample = sample
        self.workers: list[subprocess.Popen[bytes]] = []
        self.settings = Settings(
            **{
                k.removeprefix("CI_RELAY_").lower(): v
                for k, v in self.env.items()
                if k != "CI_RELAY_SPECS"
            },
            specs=[spec],
        )  # type: ignore[arg-type]
        self.rt = RelayContext(self.settings)
        self.rt.db.upgrade()

    def worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CI_RELAY_")}
        env.update(self.env)
        return env

    def start_worker(
        self, queues: str | None = None, data_dir: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """A ``ci-relay worker`` (every queue unless told), on the shared data folder unless
        given its own (as on a machine of its own)."""
        log = (self.tmp / f"worker{len(self.workers)}.log").open("wb")
        env = self.worker_env()
        if data_dir is not None:
            env["CI_RELAY_DATA_DIR"] = str(data_dir)
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "ci_relay", "worker", "--reconcile-every", "1"),
                *(("--queues", queues) if queues else ()),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def kill9(self, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)

    def serve(
        self, port: int, broker_url: str | None = None, data_dir: Path | None = None
    ) -> subprocess.Popen[bytes]:
        env = self.worker_env()
        if broker_url:
            env["CI_RELAY_BROKER_URL"] = broker_url
        if data_dir is not None:
            env["CI_RELAY_DATA_DIR"] = str(data_dir)
        log = (self.tmp / "api.log").open("ab")
        return subprocess.Popen(
            [sys.executable, "-m", "ci_relay", "serve", "--port", str(port), "--no-worker"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def runs(self) -> list[Run]:
        with self.rt.db.session() as s:
            return list(s.scalars(select(Run).order_by(Run.id)))

    def completed(self, count: int = 1) -> bool:
        runs = self.runs()
        return len(runs) >= count and all(r.state == "completed" for r in runs)

    def logs_with_stacks(self) -> str:
        """The logs after asking each live worker for its thread stacks (SIGUSR1)."""
        for proc in self.workers:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1)
        return self.logs()

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("*.log"))
        )


@pytest.fixture
def cluster(tmp_path: Path, sample_upstream: SampleUpstream) -> Iterator[Cluster]:
    with fresh_postgres_database() as url:
        c = Cluster(tmp_path, url, sample_upstream)
        try:
            yield c
        finally:
            c.stop_all()
            c.rt.db.dispose()


def _post(port: int, sample: SampleUpstream, index: int, delivery: str) -> int:
    import httpx

    body = json.dumps(pull_request_payload(sample, index)).encode()
    headers = {
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Hook-ID": "7",
        "X-Hub-Signature-256": sign(SECRET, body),
        "Content-Type": "application/json",
    }
    return httpx.post(
        f"http://127.0.0.1:{port}/webhooks/github", content=body, headers=headers, timeout=30
    ).status_code


def _api(cluster: Cluster, data_dir: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    from ci_relay.demo import free_port

    port = free_port()
    api = cluster.serve(port, data_dir=data_dir)
    import httpx

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    _wait(up, 60, "the API")
    return api, port


def test_change_flows_to_stored_results(cluster: Cluster) -> None:
    cluster.start_worker()
    api, port = _api(cluster)
    try:
        assert _post(port, cluster.sample, 2, "flow-1") == 202
        _wait(cluster.completed, 180, "the run to complete", cluster)
        (run,) = cluster.runs()
        assert run.conclusion == "success" and run.counts.get("passed", 0) > 0
        with cluster.rt.db.session() as s:
            results = s.scalars(select(TestResult)).all()
            assert len(results) == sum(run.counts.values())
            assert any(r.nodeid.endswith("test_transpose_zero_dim_cpu") for r in results)
            plan = s.scalars(select(Selection)).one().plan
        # the stored plan says why: the commit adds test_transpose_zero_dim
        chosen = {item["test"]: item for item in plan["selected"]}
        added = chosen["test/test_view_ops.py::TestViewOps::test_transpose_zero_dim"]
        assert "the change adds this test" in added["reasons"]
        assert plan["universe_size"] >= len(plan["selected"])
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=20)


def test_worker_killed_mid_task_still_completes_exactly_once(cluster: Cluster) -> None:
    first = cluster.start_worker()
    api, port = _api(cluster)
    try:
        assert _post(port, cluster.sample, 3, "kill-1") == 202

        def shard_running() -> bool:
            with cluster.rt.db.session() as s:
                return (
                    s.scalar(
                        select(func.count()).select_from(Shard).where(Shard.state == "running")
                    )
                    == 1
                )

        _wait(shard_running, 300, "the shard to start", cluster)
        cluster.kill9(first)  # the worker and the test process it started
        cluster.start_worker()
        _wait(cluster.completed, 240, "the run to complete after the kill", cluster)
        (run,) = cluster.runs()
        with cluster.rt.db.session() as s:
            shard = s.scalars(select(Shard)).one()
            assert shard.attempts == 2 and shard.state == "done"
            nodeids = [r.nodeid for r in s.scalars(select(TestResult))]
        assert len(nodeids) == len(set(nodeids)) == sum(run.counts.values()) > 0
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=20)


def test_broker_restart_with_queued_events_loses_nothing(cluster: Cluster) -> None:
    api, port = _api(cluster)  # no worker yet: events wait in Redis
    try:
        for i, index in enumerate((1, 2, 3)):
            assert _post(port, cluster.sample, index, f"queued-{i}") == 202
        assert redis.Redis(REDIS_HOST, REDIS_PORT, db=cluster.db_number).dbsize() > 0
        # Redis here keeps nothing on disk: a restart drops every queued message
        subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "shutdown", "nosave"], check=False)
        _wait(
            lambda: subprocess.run(["redis-cli", "ping"], capture_output=True).returncode != 0,
            20,
            "redis to stop",
        )
        subprocess.run(REDIS_START, check=True)
        _wait(
            lambda: (
                subprocess.run(["redis-cli", "ping"], capture_output=True).stdout.strip() == b"PONG"
            ),
            20,
            "redis to start",
        )
        assert redis.Redis(REDIS_HOST, REDIS_PORT, db=cluster.db_number).dbsize() == 0
        cluster.start_worker()
        _wait(
            lambda: cluster.completed(3),
            300,
            "three runs after the broker restart",
            cluster,
        )
        with cluster.rt.db.session() as s:
            assert {d.state for d in s.scalars(select(Delivery))} == {"processed"}
    finally:
        subprocess.run(REDIS_START, check=False, capture_output=True)
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=20)


def test_api_killed_after_202_the_delivery_is_still_processed(cluster: Cluster) -> None:
    from ci_relay.demo import free_port

    port = free_port()
    # a broker that does not answer: the API stores, answers 202, cannot enqueue
    api = cluster.serve(port, broker_url=f"redis://127.0.0.1:{free_port()}/0")
    import httpx

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    _wait(up, 60, "the API")
    assert _post(port, cluster.sample, 4, "api-kill-1") == 202
    os.killpg(api.pid, signal.SIGKILL)
    api.wait(timeout=10)
    with cluster.rt.db.session() as s:
        assert s.scalars(select(Delivery)).one().state == "received"
    cluster.start_worker()  # its reconciler finds the stored delivery
    _wait(cluster.completed, 240, "the run after the API was killed", cluster)
    assert len(cluster.runs()) == 1


def test_reports_reach_the_crcr_callback_through_real_workers(cluster: Cluster) -> None:
    """in_progress then completed, sent by the workers' report queue; a 503 with Retry-After
    on the first attempt is retried, not lost."""
    from tests.reporting_fakes import CallbackReceiver

    receiver = CallbackReceiver()
    receiver.script(503, headers={"Retry-After": "1"})
    with receiver.running() as url:
        cluster.env["CI_RELAY_CRCR_CALLBACK_URL"] = url
        cluster.start_worker()
        api, port = _api(cluster)
        try:
            assert _post(port, cluster.sample, 2, "report-1") == 202
            _wait(cluster.completed, 180, "the run to complete", cluster)

            def both_sent() -> bool:
                with cluster.rt.db.session() as s:
                    states = [m.state for m in s.scalars(select(OutboxMessage))]
                return states == ["sent", "sent"]

            _wait(both_sent, 120, "both reports to be sent", cluster)
        finally:
            os.killpg(api.pid, signal.SIGTERM)
            api.wait(timeout=20)
    statuses = [body["workflow"]["status"] for body in receiver.accepted]
    assert statuses == ["in_progress", "completed"]
    (run,) = cluster.runs()
    completed = receiver.accepted[1]["workflow"]
    assert completed["conclusion"] == "success"
    assert completed["test_results"]["total"] == sum(run.counts.values()) > 0
    with cluster.rt.db.session() as s:
        attempts = [m.attempts for m in s.scalars(select(OutboxMessage).order_by(OutboxMessage.id))]
    assert attempts[0] == 2  # the 503, then the retry that went through
    assert len(receiver.posts()) == 3


def test_the_api_and_each_worker_on_a_machine_of_its_own(cluster: Cluster) -> None:
    """Nothing shared but PostgreSQL and Redis: the API, a general worker (intake, select,
    report, triage) and an exec worker each with their own data folder, the workers each
    fetching their own upstream mirror. A change runs end to end, and its results, the
    shard's log tail and the sent reports are all visible from the API."""
    import httpx

    from tests.reporting_fakes import CallbackReceiver

    hosts = {name: cluster.tmp / f"host-{name}" for name in ("api", "general", "exec")}
    receiver = CallbackReceiver()
    with receiver.running() as url:
        cluster.env["CI_RELAY_CRCR_CALLBACK_URL"] = url
        cluster.start_worker("intake,select,report,triage", hosts["general"])
        cluster.start_worker("exec.cpu", hosts["exec"])
        api, port = _api(cluster, hosts["api"])
        try:
            assert _post(port, cluster.sample, 2, "hosts-1") == 202
            _wait(cluster.completed, 180, "the run to complete", cluster)

            def both_sent() -> bool:
                with cluster.rt.db.session() as s:
                    return [m.state for m in s.scalars(select(OutboxMessage))] == ["sent"] * 2

            _wait(both_sent, 120, "both reports to be sent", cluster)
            (run,) = cluster.runs()
            raw = httpx.get(f"http://127.0.0.1:{port}/api/runs/{run.id}", timeout=30).json()
            view = httpx.get(f"http://127.0.0.1:{port}/api/runs/{run.id}/view", timeout=30).json()
        finally:
            os.killpg(api.pid, signal.SIGTERM)
            api.wait(timeout=20)
    assert raw["conclusion"] == "success"
    results = [r for shard in raw["shards"] for r in shard["results"]]
    assert len(results) == sum(run.counts.values()) > 0
    assert all(shard["log_tail"] for shard in view["run"]["shards"]), view["run"]["shards"]
    assert [r["state"] for r in view["reports"]] == ["sent", "sent"]
    assert [b["workflow"]["status"] for b in receiver.accepted] == ["in_progress", "completed"]
    # each machine used its own folder: the workers their own mirror, the API none
    assert not (cluster.tmp / "data").exists()
    assert list((hosts["general"] / "mirrors").iterdir())
    assert list((hosts["exec"] / "mirrors").iterdir())
    assert not (hosts["api"] / "mirrors").exists()


SLOW_TEST = """
import time


def test_takes_its_time():
    time.sleep(20)
"""


def _with_slow_commit(sample: SampleUpstream, dest: Path) -> SampleUpstream:
    """A copy of the sample upstream with one more commit: a test that sleeps 20 s, still
    running when the first worker is stopped (a worker that waited for it would store its
    result)."""
    subprocess.run(["git", "clone", "-q", str(sample.path), str(dest)], check=True)
    (dest / "test" / "test_slow.py").write_text(SLOW_TEST)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "add", "test/test_slow.py"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "Add a slow test"], cwd=dest, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=dest, capture_output=True, text=True, check=True
    ).stdout.strip()
    return SampleUpstream(dest, [*sample.commits, SampleCommit(head, "Add a slow test")])


@pytest.mark.container
def test_a_stopped_worker_stops_its_shard_container_and_the_next_worker_runs_it(
    tmp_path: Path, sample_upstream: SampleUpstream
) -> None:
    """SIGTERM to a worker with a shard running in a container: the container goes at once
    (the worker does not wait for the shard), the shard is left without a verdict, and the
    next worker runs it to the end (attempt 2)."""
    import docker
    from ci_relay.execution.runtimes import PODMAN_SOCKET
    from tests.test_container_cleanup import _owned_by

    slow = _with_slow_commit(sample_upstream, tmp_path / "upstream")
    engine = docker.DockerClient(base_url=PODMAN_SOCKET, timeout=60)
    with fresh_postgres_database() as url:
        cluster = Cluster(tmp_path, url, slow)
        (tmp_path / "small.yaml").write_text(SMALL_SPEC.replace("test_view_ops.py", "test_slow.py"))
        cluster.env["CI_RELAY_RUNTIME"] = "container"
        try:
            first = cluster.start_worker()
            api, port = _api(cluster)
            try:
                assert _post(port, slow, len(slow.commits) - 1, "stop-1") == 202
                _wait(
                    lambda: any(c.state == "running" for c in _owned_by(engine, first.pid)),
                    180,
                    "the shard's container",
                    cluster,
                )
                os.killpg(first.pid, signal.SIGTERM)
                first.wait(timeout=120)  # a hang guard only: the test itself sleeps 20 s
                assert _owned_by(engine, first.pid) == []
                with cluster.rt.db.session() as s:
                    shard = s.scalars(select(Shard)).one()
                    assert (shard.state, shard.attempts) == ("running", 1), cluster.logs()
                    assert s.scalar(select(func.count()).select_from(TestResult)) == 0
                assert "interrupted" in cluster.logs() and "removed 1 running shard" in (
                    cluster.logs()
                )
                cluster.start_worker()
                _wait(cluster.completed, 300, "the run after the stop", cluster)
                (run,) = cluster.runs()
                with cluster.rt.db.session() as s:
                    shard = s.scalars(select(Shard)).one()
                    assert (shard.state, shard.attempts) == ("done", 2)
                assert run.conclusion == "success" and run.counts.get("passed") == 1
            finally:
                os.killpg(api.pid, signal.SIGTERM)
                api.wait(timeout=20)
        finally:
            cluster.stop_all()
            cluster.rt.db.dispose()
            engine.close()
