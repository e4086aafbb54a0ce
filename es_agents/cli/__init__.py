"""``es-agents``: the command line for people and scripts.

One module per group of commands; importing them registers them on ``cli``.
Every command ends with one of the exit codes of ``es_agents.cli.base``; an error
is one line on stderr (text) or ``{"error": ..., "kind": ...}`` on stdout (json).
"""

from __future__ import annotations

import sys

import click

from es_agents.cli import (
    acls,
    commands,
    dev,
    inspect,
    keys,
    lab,
    retention,
    schedule,
    serve,
    show,
    ui,
    upgrade,
)
from es_agents.cli.base import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    cli,
    echo_json,
    machine,
)
from es_agents.errors import (
    AppendError,
    ConfigError,
    EsAgentsError,
    Forbidden,
    NotFound,
    Unavailable,
)

__all__ = [
    "acls",
    "cli",
    "commands",
    "dev",
    "inspect",
    "keys",
    "lab",
    "main",
    "retention",
    "schedule",
    "serve",
    "show",
    "ui",
    "upgrade",
]


def _fail(kind: str, message: str, code: int) -> None:
    if machine():
        echo_json({"error": message, "kind": kind})
    else:
        prefix = {"unavailable": "unavailable", "not_found": "not found"}.get(
            kind, "error"
        )
        click.echo(f"{prefix}: {message}", err=True)
    sys.exit(code)


def main() -> None:
    try:
        code = cli(standalone_mode=False)  # --help, --version: their exit code
        if isinstance(code, int):
            sys.exit(code)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.UsageError as e:
        if machine():
            _fail("usage", e.format_message(), EXIT_USAGE)
        e.show()
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        _fail("error", e.format_message(), e.exit_code)
    except ConfigError as e:
        _fail("config", str(e), EXIT_USAGE)
    except NotFound as e:
        _fail("not_found", str(e), EXIT_NOT_FOUND)
    except Forbidden as e:
        _fail("forbidden", str(e), EXIT_REFUSED)
    except (Unavailable, AppendError) as e:
        _fail("unavailable", str(e), EXIT_UNAVAILABLE)
    except EsAgentsError as e:
        _fail(type(e).__name__, str(e), EXIT_REFUSED)
    except TimeoutError as e:  # `wait`: not there in time
        _fail("timeout", str(e), EXIT_UNAVAILABLE)


if __name__ == "__main__":
    main()
