"""Publishing to the broker off the request path.

The intake answers 202 once the delivery is committed to the database; sending
the follow-up task happens here, in one background thread with one producer,
so broker latency never shows in the ack. Anything still buffered when the
process dies is recovered by the reconciler from the database.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from ci_relay.steps import Next

log = logging.getLogger("ci_relay.service.publisher")


class BackgroundPublisher:
    def __init__(self, send: Callable[[list[Next]], None], maxsize: int = 100_000) -> None:
        self._send = send
        self._queue: queue.Queue[list[Next] | None] = queue.Queue(maxsize)
        self._thread = threading.Thread(target=self._run, name="ci-relay-publisher", daemon=True)
        self._thread.start()

    def submit(self, steps: list[Next]) -> None:
        """Queue steps for sending; when the buffer is full, drop them (the reconciler resends)."""
        try:
            self._queue.put_nowait(steps)
        except queue.Full:
            log.warning("publisher buffer full; %d step(s) left to the reconciler", len(steps))

    def _run(self) -> None:
        while True:
            steps = self._queue.get()
            if steps is None:
                return
            self._send(steps)  # enqueue() logs broker failures itself

    def close(self, timeout: float = 10) -> None:
        """Send what is buffered, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
