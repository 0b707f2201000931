"""``ci-relay rerun RUN``: ask a relay to queue a failed or errored run again."""

from __future__ import annotations

from typing import Annotated

import typer

from ci_relay.cli.common import _fail, _settings, out, post_to_relay

commands = typer.Typer()


@commands.command("rerun")
def rerun(
    run_id: Annotated[int, typer.Argument(min=1, help="The run to recover (its id).")],
    relay: Annotated[
        str | None,
        typer.Option(
            "--relay",
            help="The relay's base URL. Default: CI_RELAY_PUBLIC_URL.",
        ),
    ] = None,
    failed_only: Annotated[
        bool,
        typer.Option("--failed-only", help="Run again only the shards that failed."),
    ] = False,
) -> None:
    """Queue a finished run that failed or errored again, as the next attempt of the same
    change and backend with the same plan (the dispatch token comes from
    CI_RELAY_DISPATCH_TOKEN). Exit 2 when the relay refuses, with its reason."""
    settings = _settings()
    base = relay or settings.public_url
    if not base:
        raise _fail("name the relay: --relay URL (or set CI_RELAY_PUBLIC_URL)")
    if not base.startswith(("http://", "https://")):
        raise _fail(f"--relay {base!r}: not an http(s) URL")
    secret = settings.dispatch_token
    token = secret.get_secret_value() if secret else ""
    if not token:
        raise _fail("a rerun needs the relay's dispatch token in CI_RELAY_DISPATCH_TOKEN")
    url = f"{base.rstrip('/')}/api/runs/{run_id}/rerun"
    got = post_to_relay(url, token, {"failed_only": failed_only}, "rerun")
    page = base.rstrip("/") + str(got["url"])
    out.print(
        f"run {run_id} queued again as run {got['id']} (attempt {got['attempt']}, "
        f"{'failed shards' if got['scope'] == 'failed' else 'whole plan'}): {page}",
        soft_wrap=True,
    )
