import os
import pathlib
import signal
import socket
import time

from torch.testing._internal.common_utils import TestCase


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
