"""HUD-style dashboard: server-rendered pages and the JSON API behind each of them."""

from ci_relay.dashboard.routes import install

__all__ = ["install"]
