import contextlib
import errno
import os
import pathlib
import signal
import socket
import tempfile
import time

from torch.testing._internal.common_utils import TestCase

# The hostile tests below try to break out of the runtime. Each one FAILS (or is killed)
# when the isolation holds, and passes only when it got out: it returns as soon as one
# attempt works. The shard records every outcome; tests/test_execution.py checks them.
CHUNK = os.urandom(1 << 20)  # written again and again: real blocks, nothing to compress


def _refusal(exc):
    return errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__


def _scratch_quota():
    return int(os.environ.get("FAULTS_SCRATCH_MB", "64")) * 1024 * 1024


def _check_scratch_is_free(case):
    """After a test that filled the disk: its files are gone and there is room again."""
    home = pathlib.Path(os.environ["HOME"])
    used = sum(p.stat().st_blocks * 512 for p in home.rglob("*") if p.is_file())
    case.assertLess(used, 1024 * 1024, f"{used} bytes still in {home}")
    probe = pathlib.Path(os.environ["TMPDIR"]) / "room"
    probe.write_bytes(CHUNK * 8)
    probe.unlink()


class TestFaults(TestCase):
    def test_a_ok(self):
        self.assertEqual(1, 1)

    def test_b_segfault(self):
        os.kill(os.getpid(), signal.SIGSEGV)

    def test_c_ok(self):
        self.assertTrue(True)

    def test_d_hang(self):
        time.sleep(3600)

    def test_e_network(self):
        socket.create_connection(("127.0.0.1", 6379), timeout=2)

    def test_f_secret(self):
        self.assertNotIn("CI_RELAY_WEBHOOK_SECRET", os.environ)
        self.assertNotIn("MY_SECRET", os.environ)

    def test_g_write_outside(self):
        pathlib.Path("/etc/ci-relay-should-not-exist").write_text("x")

    def test_h_memory(self):
        block = bytearray(8 * 1024**3)  # far past the limit: refused at once, nothing touched
        self.assertTrue(block)

    def test_i_flaky(self):
        marker = pathlib.Path(os.environ["TMPDIR"]) / "flaky-once"
        if not marker.exists():
            marker.write_text("1")
            self.fail("first run fails")

    def test_j_ok(self):
        pass

    def test_k_raise_privileges(self):
        refused = []
        attempts = {
            "setuid": lambda: os.setuid(0),
            "setgid": lambda: os.setgid(0),
            "setgroups": lambda: os.setgroups([0]),
            "chroot": lambda: os.chroot("/"),
        }
        for name, attempt in attempts.items():
            try:
                attempt()
            except OSError as exc:
                refused.append(f"{name} {_refusal(exc)}")
            else:
                return  # got a privilege: out
        status = dict(
            line.split(":", 1)
            for line in pathlib.Path("/proc/self/status").read_text().splitlines()
        )
        caps = {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs")}
        if os.getuid() == 0 or caps["CapEff"] != "0" * 16 or caps["NoNewPrivs"] != "1":
            return  # root, a capability, or a setuid program could give one: out
        self.fail(
            f"refused: {', '.join(refused)}; uid {os.getuid()}; "
            + ", ".join(f"{k} {v}" for k, v in caps.items())
        )

    def test_l_ok(self):
        pass

    def test_m_write_outside_scratch(self):
        import torch

        targets = {
            "etc": pathlib.Path("/etc/ci-relay-planted"),
            "upstream": pathlib.Path(__file__).parent / "planted.py",
            "home": pathlib.Path(os.environ["FAULTS_WORKER_HOME"]) / "ci-relay-planted",
            "python": pathlib.Path(torch.__file__).parent / "planted.py",
            "usr": pathlib.Path("/usr/lib/ci-relay-planted"),
        }
        refused = []
        for name, path in targets.items():
            try:
                path.write_text("planted by an upstream test")
            except OSError as exc:
                refused.append(f"{name} {_refusal(exc)}")
            else:
                return  # wrote outside its scratch folder: out
        self.fail("refused: " + ", ".join(refused))

    def test_n_ok(self):
        pass

    def test_o_read_worker_secrets(self):
        import ci_relay

        paths = [pathlib.Path(p) for p in os.environ["FAULTS_SECRET_PATHS"].split(os.pathsep)]
        paths.append(pathlib.Path(ci_relay.__file__).parents[1] / "pyproject.toml")  # the repo
        seen, dump = [], []
        for path in paths:
            try:
                data = path.read_bytes()
            except OSError as exc:
                seen.append(f"{path.name} {_refusal(exc)}")
            else:
                seen.append(f"{path.name} {len(data)} bytes")
                dump.append(f"{path}: {data!r}")
        environs = sorted(pathlib.Path("/proc").glob("[0-9]*/environ"))
        readable = 0
        for path in environs:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            readable += 1
            dump.append(f"{path}: {data!r}")
        seen.append(f"environ {readable}/{len(environs)} readable")
        # everything read is in the failure's text: the shard's report must hold no secret
        self.fail("read: " + ", ".join(seen) + "\n" + "\n".join(dump))

    def test_p_ok(self):
        pass

    def test_q_reach_the_network(self):
        attempts = {
            "redis": (socket.AF_INET, ("127.0.0.1", 6379)),
            "podman": (socket.AF_UNIX, "/run/ci-relay/podman.sock"),
            "outside": (socket.AF_INET, ("1.1.1.1", 53)),
        }
        refused = []
        routes = pathlib.Path("/proc/net/route").read_text().splitlines()[1:]
        gateways = [r.split()[2] for r in routes if r.split()[1] == "00000000"]
        if gateways:  # the host's side of a bridge: PostgreSQL, Redis, the engine's API...
            gateway = socket.inet_ntoa(int(gateways[0], 16).to_bytes(4, "little"))
            attempts["gateway"] = (socket.AF_INET, (gateway, 5432))
        else:
            refused.append("gateway none")
        for name, (family, address) in attempts.items():
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                try:
                    sock.connect(address)
                except OSError as exc:
                    refused.append(f"{name} {_refusal(exc)}")
                else:
                    return  # connected: out
        self.fail("refused: " + ", ".join(refused))

    def test_r_ok(self):
        pass

    # Filling the disk: run with a small scratch quota (FAULTS_SCRATCH_MB). Each writer
    # stops by itself only far past the quota, which a working watchdog never lets it reach.

    def test_s_disk_one_file(self):
        path = pathlib.Path(os.environ["TMPDIR"]) / "huge.bin"
        written = 0
        with path.open("wb", buffering=0) as out:
            while written < 32 * _scratch_quota():
                try:
                    written += out.write(CHUNK)
                except OSError:  # the file-size limit: keep pushing until stopped
                    time.sleep(0.05)
                time.sleep(0.005)
        path.unlink()  # never stopped: out

    def test_t_ok_scratch_freed(self):
        _check_scratch_is_free(self)

    def test_u_disk_many_files(self):
        folder = pathlib.Path(os.environ["TMPDIR"]) / "many"
        folder.mkdir()
        for i in range(32 * _scratch_quota() // len(CHUNK)):
            (folder / f"{i}.bin").write_bytes(CHUNK)
            time.sleep(0.005)
        for path in folder.iterdir():  # never stopped: out
            path.unlink()

    def test_v_ok_scratch_freed(self):
        _check_scratch_is_free(self)

    def test_w_disk_deleted_files(self):
        # deleted while open: no tree walk sees them, the disk they take is as real
        with contextlib.ExitStack() as files:
            current, written = files.enter_context(tempfile.TemporaryFile()), 0
            while written < 32 * _scratch_quota():
                try:
                    written += current.write(CHUNK)
                    current.flush()
                except OSError:  # this one is at the file-size limit: the next one
                    current = files.enter_context(tempfile.TemporaryFile())
                time.sleep(0.005)
        # never stopped: out

    def test_x_ok_scratch_freed(self):
        _check_scratch_is_free(self)

    def test_y_file_past_its_limit(self):
        path = pathlib.Path(os.environ["TMPDIR"]) / "sparse.bin"
        with path.open("wb") as out:
            out.seek(1 << 40)  # one byte at 1 TiB: no disk used, past any file-size limit
            out.write(b"x")
        path.unlink()  # the limit did not hold: out

    def test_z_ok(self):
        pass

    def test_za_fork_bomb(self):
        children = []
        while len(children) < 1000:  # that many without a refusal: no process limit, out
            try:
                pid = os.fork()
            except OSError:  # refused: hold every process it has, and keep trying
                time.sleep(0.05)
                continue
            if pid == 0:
                try:
                    time.sleep(3600)
                finally:
                    os._exit(0)
            children.append(pid)
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)

    def test_zb_ok_after_fork_bomb(self):
        others = {int(p) for p in os.listdir("/proc") if p.isdigit()} - {
            1,
            os.getpid(),
            os.getppid(),
        }
        self.assertEqual(others, set(), "processes left over in the sandbox")
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        self.assertEqual(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), 7)
