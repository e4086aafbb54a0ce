"""``es-agents ui``: serve the web app (Starlette on uvicorn); ``ui adduser``
writes its users file."""

from __future__ import annotations

import getpass
import ipaddress
import sys
from pathlib import Path

import click

from es_agents.cli.base import EXIT_USAGE, cli


@cli.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--users",
    "users_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="ES_AGENTS_UI_USERS",
    help="A users file (`es-agents ui adduser`): people sign in with a name and "
    "password.",
)
@click.option(
    "--user-header",
    default=None,
    envvar="ES_AGENTS_UI_USER_HEADER",
    help="Request header naming the signed-in person, set by an authenticating "
    "proxy (e.g. X-Forwarded-User). Only for a UI that nothing but the proxy reaches.",
)
@click.option(
    "--as",
    "token_user",
    default=None,
    help="Without users or a proxy: who the printed token signs in "
    "(default: the local user).",
)
@click.option(
    "--secret",
    envvar="ES_AGENTS_UI_SECRET",
    default=None,
    help="Signs session cookies (default: random, so sessions end with the process).",
)
@click.option("--https-only", is_flag=True, help="Session cookies over HTTPS only.")
@click.pass_context
def ui(  # noqa: PLR0917 - one option each
    ctx: click.Context,
    host: str,
    port: int,
    users_file: Path | None,
    user_header: str | None,
    token_user: str | None,
    secret: str | None,
    https_only: bool,
) -> None:
    """A web page of the runs, each run's input, conversation and timeline,
    approvals, dead letters and costs, over the same client and checks as the CLI.
    People sign in: with a users file (--users), through a proxy (--user-header),
    or by the token printed at start."""
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn  # noqa: PLC0415

    from es_agents.client import Client  # noqa: PLC0415
    from es_agents.ui.app import make_app  # noqa: PLC0415
    from es_agents.ui.auth import SignIn, Users  # noqa: PLC0415

    if users_file is not None and user_header:
        raise click.UsageError("--users or --user-header, not both")
    try:
        users = Users(users_file) if users_file is not None else None
    except (OSError, ValueError) as e:
        raise click.UsageError(f"users file: {e}") from e
    if users is not None and not len(users):
        raise click.UsageError(f"{users_file}: no users (es-agents ui adduser NAME)")
    doors = SignIn(
        users=users,
        user_header=user_header,
        token_user=token_user or getpass.getuser(),
    )
    if not _loopback(host):
        click.echo(
            f"warning: the UI listens on {host}, beyond this machine: anyone who "
            "reaches it and signs in can approve tool calls. Put it behind HTTPS "
            "(--https-only) or an authenticating proxy.",
            err=True,
        )
        if doors.mode == "header":
            click.echo(
                f"warning: {user_header} is trusted as sent: only the proxy may "
                "reach this port.",
                err=True,
            )
    address = f"http://{host}:{port}/"
    if doors.mode == "token":
        click.echo(
            f"es-agents ui on {address} -- sign in as {doors.token_user}: "
            f"{address}login?token={doors.token}",
            err=True,
        )
    else:
        click.echo(f"es-agents ui on {address} (sign-in: {doors.mode})", err=True)
    with Client() as client:
        app = make_app(client, doors, secret=secret, https=https_only)
        uvicorn.run(app, host=host, port=port, log_level="warning")


@ui.command()
@click.argument("name")
@click.option(
    "--users",
    "users_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="ES_AGENTS_UI_USERS",
    required=True,
    help="The users file (created, readable by its owner only).",
)
@click.option(
    "--password-stdin", is_flag=True, help="Read the password from standard input."
)
def adduser(name: str, users_file: Path, password_stdin: bool) -> None:
    """Add NAME to the UI's users file (or change its password); the password is
    kept as a scrypt hash."""
    from es_agents.ui.auth import Users  # noqa: PLC0415

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    try:
        Users.add(users_file, name, password)
    except ValueError as e:
        click.echo(f"refused: {e}", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(f"{name} added to {users_file}")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
