"""The runtimes' defaults that settings also name: a leaf, so that loading the settings loads
no runtime (``ci_relay.execution.runtimes`` imports these from here)."""

from __future__ import annotations

PODMAN_SOCKET = "unix:///run/ci-relay/podman.sock"  # the container engine's API socket
NOBODY = 65534  # the sandbox's default host user and group when the worker is root
