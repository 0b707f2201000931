"""ci-relay: runs the upstream PyTorch tests that matter for an out-of-tree backend."""

__version__ = "0.1.0"
