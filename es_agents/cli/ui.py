"""``es-agents ui``: serve the web app (Starlette on uvicorn)."""

from __future__ import annotations

import click

from es_agents.cli.base import cli


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--user-header",
    default=None,
    envvar="ES_AGENTS_UI_USER_HEADER",
    help="Request header naming the approver, set by an authenticating proxy "
    "(e.g. X-Forwarded-User); without it the page asks for a name.",
)
def ui(host: str, port: int, user_header: str | None) -> None:
    """A web page of the runs, each run's timeline, approvals, dead letters and
    costs, over the same client and checks as the CLI."""
    import uvicorn  # noqa: PLC0415

    from es_agents.client import Client  # noqa: PLC0415
    from es_agents.ui.app import make_app  # noqa: PLC0415

    with Client() as client:
        click.echo(f"es-agents ui on http://{host}:{port}/", err=True)
        uvicorn.run(
            make_app(client, user_header), host=host, port=port, log_level="warning"
        )
