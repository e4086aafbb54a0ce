"""Least-privilege Postgres roles, made by the migrations: a worker, a projector, a
client and a reader each log in as a member of their role. The whole flow runs on
those logins (worker, projector, start, approve, status), and each role is refused
what is not its job -- a reader cannot write at all."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from es_agents.adapters.postgres import Database
from es_agents.dev import DevStack
from es_agents.lab.demo import cli, run_worker
from tests.integration.test_commands import until

pytestmark = pytest.mark.integration

ROLES = ("reader", "client", "worker", "projector")


@pytest.fixture
def logins(dev_stack: DevStack) -> Iterator[tuple[str, dict[str, str]]]:
    """A migrated database of this test's own, and a login URL per role."""
    name = f"es_roles_{uuid.uuid4().hex[:10]}"
    dev_stack.postgres.create_database(name)
    admin = dev_stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    db = Database(admin)
    db.migrate()
    db.close()
    users = {role: f"{name}_{role}" for role in ROLES}
    with psycopg.connect(admin, autocommit=True) as conn:
        for role, user in users.items():
            conn.execute(f'CREATE ROLE "{user}" LOGIN IN ROLE es_{role}')
    host = admin.split("@", 1)[1]
    try:
        yield admin, {r: f"postgresql://{u}@{host}" for r, u in users.items()}
    finally:
        dev_stack.postgres.drop_database(name)
        with psycopg.connect(
            admin.rsplit("/", 1)[0] + "/postgres", autocommit=True
        ) as c:
            for user in users.values():
                c.execute(f'DROP ROLE IF EXISTS "{user}"')


def _refused(url: str, sql: str) -> bool:
    with psycopg.connect(url) as conn:
        try:
            conn.execute(sql)
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False


def test_each_role_does_its_job_and_nothing_else(
    logins: tuple[str, dict[str, str]], env: dict[str, str]
) -> None:
    _, url = logins
    writes = {
        "effects": "INSERT INTO effects (idempotency_key, run_id, step, tool, status) "
        "VALUES ('r:1', 'r', 1, 't', 'started')",
        "runs": "UPDATE runs SET status = 'failed'",
        "commands": "UPDATE commands SET status = 'refused'",
        "approver_keys": "DELETE FROM approver_keys",
    }
    allowed = {
        "reader": set(),
        "client": {"commands"},
        "worker": {"effects", "commands"},
        "projector": {"runs"},
    }
    for role in ROLES:
        with psycopg.connect(url[role]) as conn:
            conn.execute("SELECT count(*) FROM runs").fetchone()  # all may read
        for table, sql in writes.items():
            assert _refused(url[role], sql) == (table not in allowed[role]), (
                role,
                table,
            )

    def as_(role: str) -> dict[str, str]:
        return {**env, "ES_AGENTS_DATABASE_URL": url[role]}

    started = cli(
        as_("client"), "start", "research", "--queue", "--input", "{}", "--no-wait"
    )
    assert started.returncode == 0, started.stderr[-2000:]
    run = started.stdout.strip()
    worked = run_worker(as_("worker"), agent="tests.agents:gated")
    assert worked.returncode == 0, worked.stderr[-2000:]
    projected = cli(as_("projector"), "projector", "--until-caught-up")
    assert projected.returncode == 0, projected.stderr[-2000:]

    def status(role: str) -> dict[str, object]:
        done = cli(as_(role), "status", run, "-o", "json")
        assert done.returncode == 0, done.stderr[-2000:]
        value = json.loads(done.stdout)
        assert isinstance(value, dict)
        return value

    assert status("reader")["status"] == "paused"
    denied = cli(as_("reader"), "approve", run, "--by", "ann", "-o", "json")
    assert denied.returncode == 1, denied.stdout + denied.stderr[-2000:]
    assert "permission denied" in json.loads(denied.stdout)["error"]
    approved = cli(as_("client"), "approve", run, "--by", "ann", "--no-wait")
    assert approved.returncode == 0, approved.stderr[-2000:]
    worked = run_worker(as_("worker"), agent="tests.agents:gated")
    assert worked.returncode == 0, worked.stderr[-2000:]
    until(lambda: status("reader")["status"] == "completed", what="the run's end")
    denied_projector = cli(as_("reader"), "projector", "--until-caught-up")
    assert denied_projector.returncode != 0
