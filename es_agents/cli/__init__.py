"""``es-agents``: the command line for people and scripts.

One module per group of commands; importing them registers them on ``cli``.
"""

from __future__ import annotations

import sys

import click

from es_agents.cli import commands, dev, inspect, lab, serve
from es_agents.cli.base import cli
from es_agents.errors import ConfigError, EsAgentsError, Unavailable

__all__ = ["cli", "commands", "dev", "inspect", "lab", "main", "serve"]


def main() -> None:
    import logging  # noqa: PLC0415

    # librdkafka's own retries (coordinator loading, reconnects) are not news.
    logging.getLogger("es_agents.librdkafka").setLevel(logging.ERROR)
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except Unavailable as e:
        click.echo(f"unavailable: {e}", err=True)
        sys.exit(3)
    except EsAgentsError as e:
        click.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
