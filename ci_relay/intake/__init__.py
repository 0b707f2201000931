"""Receiving upstream events: signature checks, parsing, storing, enqueueing."""
