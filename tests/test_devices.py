"""Device ownership: workers on one machine never put more processes on a card than allowed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ci_relay.execution.devices import DeviceBusy, DeviceClaim, claim_device

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from ci_relay.execution.devices import claim_device
    name, lock_dir, log, hold = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
    with claim_device("spyre", 1, 1, lock_dir) as claim:
        with log.open("a") as out:
            out.write(f"{name} start {claim.device}\\n")
        time.sleep(hold)
        with log.open("a") as out:
            out.write(f"{name} end\\n")
    """
)


def test_a_backend_without_a_device_bound_claims_nothing(tmp_path: Path) -> None:
    with claim_device("cpu", 0, 1, tmp_path / "locks") as claim:
        assert claim == DeviceClaim(None)
        assert claim.env() == {}
    assert not (tmp_path / "locks").exists()


def test_two_worker_processes_take_one_card_in_turn(tmp_path: Path) -> None:
    log = tmp_path / "log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, name, str(tmp_path / "locks"), str(log), "1.0"]
        )
        for name in ("a", "b")
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    lines = log.read_text().split("\n")[:-1]
    first, second = lines[0].split()[0], lines[2].split()[0]
    assert {first, second} == {"a", "b"}
    # never interleaved: each process ends before the other starts
    assert lines == [f"{first} start 0", f"{first} end", f"{second} start 0", f"{second} end"]


def test_each_card_of_a_machine_is_used(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    with (
        claim_device("spyre", 1, 2, locks) as one,
        claim_device("spyre", 1, 2, locks) as two,
    ):
        assert {one.device, two.device} == {0, 1}
        assert one.env() == {"CI_RELAY_DEVICE_INDEX": str(one.device)}
        with (
            pytest.raises(DeviceBusy, match=r"no free spyre device after 0.3 s \(2 device"),
            claim_device("spyre", 1, 2, locks, timeout=0.3, poll=0.05),
        ):
            pass
    with claim_device("spyre", 1, 2, locks, timeout=5) as again:  # released on exit
        assert again.device == 0


def test_a_waiting_worker_is_told_who_holds_the_card(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    told: list[str] = []
    with (
        claim_device("spyre", 1, 1, locks),
        pytest.raises(DeviceBusy),
        claim_device("spyre", 1, 1, locks, timeout=0.2, poll=0.05, on_wait=told.append),
    ):
        pass
    assert len(told) == 1
    assert f"pid {os.getpid()}" in told[0]


def test_a_killed_worker_leaves_no_card_claimed(tmp_path: Path) -> None:
    locks, log = tmp_path / "locks", tmp_path / "log"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "a", str(locks), str(log), "600"])
    try:
        for _ in range(600):
            if log.exists() and "a start" in log.read_text():
                break
            holder.poll()
            assert holder.returncode is None, "the holder died before claiming"
            subprocess.run(["sleep", "0.1"], check=True)
        with pytest.raises(DeviceBusy), claim_device("spyre", 1, 1, locks, timeout=0.2, poll=0.05):
            pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        with claim_device("spyre", 1, 1, locks, timeout=30) as claim:
            assert claim.device == 0
    finally:
        if holder.poll() is None:
            holder.kill()
