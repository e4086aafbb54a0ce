"""``es-agents keys new|list|revoke``: approvers' Ed25519 keys.

``new`` writes the private key to a file only its owner can read and registers the
public key (with the approver's identity and roles) in ``approver_keys``, where
workers look it up to verify signed decisions (``approve --key FILE``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from es_agents.cli.base import (
    EXIT_NOT_FOUND,
    cli,
    emit,
    emit_many,
    machine,
    output_option,
    table,
)

if TYPE_CHECKING:
    from es_agents.approvals import Keyring


@contextmanager
def _keyring(migrate: bool = False) -> Iterator[Keyring]:
    from es_agents.app import build_client_ports  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    ports = build_client_ports(load_settings())
    try:
        if migrate:
            ports.migrate()
        yield ports.keyring
    finally:
        ports.close()


@cli.group()
def keys() -> None:
    """Approvers' keys for signed decisions (approve/reject --key)."""


@keys.command("new")
@click.option("--identity", required=True, help="The approver (what --by says).")
@click.option("--role", "roles", multiple=True, help="A role it speaks for (repeat).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    required=True,
    help="Where to write the private key (PEM, mode 0600; must not exist).",
)
@output_option
def keys_new(identity: str, roles: tuple[str, ...], out: str) -> None:
    """Make a key pair: the private key to --out, the public key registered."""
    from es_agents.approvals import new_key  # noqa: PLC0415

    path = Path(out)
    pem, key = new_key(identity, frozenset(roles))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as e:
        raise click.BadParameter(f"{path} exists", param_hint="--out") from e
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    try:
        with _keyring(migrate=True) as ring:
            ring.add(key)
    except BaseException:
        path.unlink(missing_ok=True)  # not registered: no key file either
        raise
    if machine():
        emit(_row(key) | {"private_key_file": str(path)})
        return
    click.echo(key.key_id)
    click.echo(f"private key in {path}; registered for {identity}", err=True)


@keys.command("list")
@output_option
def keys_list() -> None:
    """Every registered key: id, identity, roles, revoked."""
    with _keyring() as ring:
        rows = [_row(k) for k in ring.all()]
    if machine():
        emit_many(rows)
        return
    table(rows, ["key_id", "identity", "roles", "revoked"])


@keys.command("revoke")
@click.argument("key_id")
@output_option
def keys_revoke(key_id: str) -> None:
    """Refuse every decision signed with KEY_ID from now on."""
    with _keyring() as ring:
        found = ring.revoke(key_id)
    if machine():
        emit({"key_id": key_id, "revoked": found})
    elif found:
        click.echo(f"{key_id}: revoked", err=True)
    if not found:
        if not machine():
            click.echo(f"no key {key_id}", err=True)
        raise SystemExit(EXIT_NOT_FOUND)


def _row(key: Any) -> dict[str, Any]:
    return {
        "key_id": key.key_id,
        "identity": key.identity,
        "roles": sorted(key.roles),
        "revoked": key.revoked,
    }


@cli.group()
def vault() -> None:
    """The master key that wraps runs' data keys (encrypted agents)."""


@vault.command("new-master-key")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write it to this file (mode 0600) instead of printing it.",
)
def vault_new_master_key(out: str | None) -> None:
    """A new random master key (base64 of 32 bytes), for ES_AGENTS_MASTER_KEY or
    ES_AGENTS_MASTER_KEY_FILE."""
    from es_agents.vault import new_master_key  # noqa: PLC0415

    key = new_master_key()
    if out is None:
        click.echo(key)
        return
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as e:
        raise click.BadParameter(f"{out} exists", param_hint="--out") from e
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    click.echo(f"master key in {out}", err=True)


@vault.command("rewrap")
@click.option(
    "--old-key-file",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="The master key being retired (the current one is in the settings).",
)
@output_option
def vault_rewrap(old_key_file: str) -> None:
    """Rotate the master key: wrap every data key wrapped by the old master key
    under the current one (ES_AGENTS_MASTER_KEY[_FILE]). Payloads are untouched."""
    from es_agents.app import build_client_ports  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415
    from es_agents.vault import load_master_key  # noqa: PLC0415

    old = load_master_key(None, old_key_file)
    if old is None:
        raise click.BadParameter("no key in the file", param_hint="--old-key-file")
    ports = build_client_ports(load_settings())
    try:
        done = ports.vault.rewrap(old)
    finally:
        ports.close()
    if machine():
        emit({"rewrapped": done})
    else:
        click.echo(f"{done} data key(s) now wrapped by the current master key")
