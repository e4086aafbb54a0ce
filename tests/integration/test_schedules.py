"""Schedules on the real broker and database: each tick starts exactly one run --
with two workers firing, one of them killed between sending a tick's start and
moving the schedule on, another SIGKILLed mid-way -- and a schedule row written in
Postgres by anyone but a worker starts nothing; and across a broker outage
(serial: it kills the shared broker)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from es_agents.client import Client
from es_agents.client_schedules import ScheduleView
from es_agents.core.schedules import run_id_for
from es_agents.dev import DevStack
from es_agents.errors import NotFound
from es_agents.lab.demo import _env, cli
from es_agents.settings import Settings
from tests.integration.test_commands import _kafka, until, worker
from tests.test_support import ROOT

pytestmark = pytest.mark.integration


@contextmanager
def killable_worker(
    env: dict[str, str], crash_at: str = ""
) -> Iterator[subprocess.Popen[str]]:
    """A worker to be killed (or that SIGKILLs itself at ``crash_at``)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "worker",
            "--agent",
            "tests.agents:quick",
        ],
        cwd=ROOT,
        env=_env(**env, ES_AGENTS_CRASH_AT=crash_at),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


def ticks_of(view: ScheduleView) -> list[datetime]:
    """Every tick of an every-second schedule up to its last one fired."""
    assert view.last_tick is not None
    n = int((view.last_tick - view.created_at).total_seconds())
    return [view.created_at + timedelta(seconds=k) for k in range(1, n + 1)]


def fired_after(client: Client, name: str, ticks: int) -> None:
    """Wait until ``name`` fired ``ticks`` more ticks than it has now."""
    before = client.schedules.get(name).last_tick

    def moved() -> bool:
        last = client.schedules.get(name).last_tick
        if last is None:
            return False
        return before is None or last - before >= timedelta(seconds=ticks)

    until(moved, 90, f"{name}: {ticks} more ticks")


def test_each_tick_starts_one_run_across_workers_a_crash_and_a_kill(
    env: dict[str, str], database_url: str
) -> None:
    settings = Settings(kafka=_kafka(env), database_url=database_url)
    with (
        Client(settings) as client,
        worker(env, "tests.agents:quick"),
        killable_worker(env, "after_send:schedule") as doomed,
    ):
        until(lambda: client.agents() != [], 60, "a worker serving quick")
        result = client.schedules.set(
            "beat", "quick", {"n": 1}, every="1s", missed="all", by="ops", wait=30
        )
        assert result.status == "applied", result.reason
        # The doomed worker dies once it sent a tick's start and before the
        # schedule moved on: the other worker fires that tick again.
        until(lambda: doomed.poll() is not None, 60, "the doomed worker's crash point")
        assert doomed.returncode == -signal.SIGKILL
        with killable_worker(env) as third:
            fired_after(client, "beat", 3)
            third.send_signal(signal.SIGKILL)  # no goodbye: its partitions move
            third.wait(30)
            fired_after(client, "beat", 3)
        paused = client.schedules.pause("beat", by="ops", wait=120)  # a rebalance
        assert paused.status == "applied", paused.reason
        view = client.schedules.get("beat")
        assert view.paused
        ticks = ticks_of(view)
        assert len(ticks) >= 6
        for tick in ticks:  # every tick one run, none twice, none lost
            run_id = run_id_for("beat", tick)
            until(
                lambda r=run_id: _completed(client, r),  # type: ignore[misc]
                120,
                f"run {run_id} completed",
            )
            started = [e for e in client.events(run_id) if e.wire_name == "run_started"]
            assert len(started) == 1, run_id
        after = view.last_tick + timedelta(seconds=1)  # type: ignore[operator]
        with pytest.raises(NotFound):
            client.status(run_id_for("beat", after))  # type: ignore[arg-type]


def _completed(client: Client, run_id: str) -> bool:
    try:
        return client.status(run_id).status == "completed"
    except NotFound:
        return False


def test_a_schedule_row_not_written_by_a_worker_starts_nothing(
    env: dict[str, str], database_url: str
) -> None:
    settings = Settings(kafka=_kafka(env), database_url=database_url)
    prefix = env["ES_AGENTS_TOPIC_PREFIX"]
    with Client(settings) as client, worker(env, "tests.agents:quick"):
        until(lambda: client.agents() != [], 60, "a worker serving quick")
        for name in ("control", "victim"):
            done = cli(
                env, "schedule", "add", name, "--agent", "quick", "--every", "1s"
            )
            assert done.returncode == 0, done.stderr
        fired_after(client, "victim", 1)
        with psycopg.connect(database_url, autocommit=True) as conn:
            # A new schedule, and the victim's input changed under its MAC.
            conn.execute(
                "INSERT INTO schedules (topic_prefix, name, agent, input_json, "
                "every_seconds, missed, created_at, next_due) "
                "VALUES (%s, 'forged', 'quick', '{}', 1, 'all', now(), now())",
                (prefix,),
            )
            conn.execute(
                'UPDATE schedules SET input_json = \'{"wire": "MALLORY"}\' '
                "WHERE topic_prefix = %s AND name = 'victim'",
                (prefix,),
            )
        victim = client.schedules.get("victim").last_tick
        fired_after(client, "control", 4)  # the workers went on firing meanwhile
        assert client.schedules.get("victim").last_tick == victim
        forged = client.schedules.get("forged")
        assert forged.last_tick is None
        with pytest.raises(NotFound):
            client.status(
                run_id_for("forged", forged.created_at + timedelta(seconds=1))
            )
        # The CLI: a list, a show, a bad schedule refused before anything is sent.
        listed = cli(env, "schedule", "list", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        names = {row["name"] for row in json.loads(listed.stdout)}
        assert {"control", "victim", "forged"} <= names
        bad = cli(
            env, "schedule", "add", "x", "--agent", "quick", "--cron", "61 * * * *"
        )
        assert bad.returncode == 1
        assert "cron expression" in bad.stderr
        assert cli(env, "schedule", "show", "nope").returncode == 3
        gone = cli(env, "schedule", "delete", "control")
        assert gone.returncode == 0, gone.stderr
        assert "control" not in {v.name for v in client.schedules.list()}


def test_a_slow_start_holds_no_transaction_open_and_a_change_meanwhile_stands(
    database_url: str,
) -> None:
    """Starting a tick's run can wait out a broker's failover (seconds): the due
    schedules are claimed for a while, not held locked in an open transaction (the
    server ends one after the session's idle limit, and the worker with it). Another
    worker does not fire a claimed schedule; a schedule changed while its tick was
    being started keeps the change; a start that fails gives the claim up."""
    from es_agents.adapters.postgres import Database  # noqa: PLC0415
    from es_agents.adapters.postgres_schedules import PostgresSchedules  # noqa: PLC0415
    from es_agents.core.schedules import Schedule  # noqa: PLC0415
    from es_agents.errors import AppendError  # noqa: PLC0415
    from es_agents.ports import ScheduleRow  # noqa: PLC0415

    db = Database(database_url, idle_in_transaction=0.5)
    db.migrate()
    schedules = PostgresSchedules(db, f"claims-{uuid.uuid4().hex[:8]}")
    now = datetime.now(UTC)
    every = Schedule("slow", "quick", "{}", "all", now - timedelta(hours=1), None, 60)
    schedules.put(ScheduleRow(every, now - timedelta(seconds=1), "mac"))
    later = now + timedelta(hours=1)
    fired: list[list[str]] = []
    others: list[str] = []

    def failing(rows: Any, at: datetime) -> dict[str, Any]:
        raise AppendError("the broker did not acknowledge")

    def other(rows: Any, at: datetime) -> dict[str, Any]:
        others.extend(r.schedule.name for r in rows)
        return {}

    def slow(rows: Any, at: datetime) -> dict[str, Any]:
        fired.append([r.schedule.name for r in rows])
        schedules.fire_due("quick", other)  # another worker, meanwhile
        # Changed meanwhile (paused, due later): the change stands.
        schedules.put(ScheduleRow(every.paused_as(True), later, "mac"))
        time.sleep(1.0)  # the start waits (the scenario: twice the idle limit)
        return {"slow": (at + timedelta(seconds=60), at)}

    try:
        with pytest.raises(AppendError):
            schedules.fire_due("quick", failing)
        assert schedules.fire_due("quick", slow) == 1  # the claim given up
        assert fired == [["slow"]]
        assert others == []
        row = schedules.get("slow")
        assert row is not None
        assert row.schedule.paused
        assert row.next_due == later
        assert row.last_tick is None  # the move after the change was not applied
    finally:
        db.close()


@pytest.mark.serial  # kills the dev stack's broker under every other test
def test_ticks_due_during_a_broker_outage_start_once_each_after_it(
    dev_stack: DevStack, env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """The broker SIGKILLed for the time of several ticks under a supervised
    worker: with the policy ``all``, every tick of the outage starts its run once
    the broker is back, and no tick starts two."""
    settings = Settings(kafka=_kafka(env), database_url=database_url)
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "serve",
            "--agent",
            "tests.agents:quick",
            "--no-projector",
        ],
        cwd=ROOT,
        env=_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("w"),
    )
    try:
        with Client(settings) as client:
            until(lambda: client.agents() != [], 60, "a worker serving quick")
            set_ = client.schedules.set(
                "outage", "quick", every=1, missed="all", wait=30
            )
            assert set_.status == "applied", set_.reason
            fired_after(client, "outage", 2)
            dev_stack.kafka.kill()  # no controlled shutdown
            down_at = client.schedules.get("outage").last_tick
            until(lambda: dev_stack.kafka.proc.pid() is None, 30, "the broker gone")
            dev_stack.kafka.start()  # waits until it answers
            up_at = datetime.now(UTC)
            fired_after(client, "outage", 4)  # past the outage, fired by the worker
            paused = client.schedules.pause("outage", wait=120)
            assert paused.status == "applied", paused.reason
            view = client.schedules.get("outage")
            ticks = ticks_of(view)
            assert down_at is not None
            assert view.last_tick is not None
            assert view.last_tick - down_at >= timedelta(seconds=4)
            during = [t for t in ticks if down_at < t < up_at - timedelta(seconds=1)]
            assert len(during) >= 2, (down_at, up_at)  # ticks due while it was down
            for tick in ticks:
                run_id = run_id_for("outage", tick)
                until(
                    lambda r=run_id: _completed(client, r),  # type: ignore[misc]
                    120,
                    f"run {run_id} completed",
                )
                started = [
                    e for e in client.events(run_id) if e.wire_name == "run_started"
                ]
                assert len(started) == 1, run_id
    except AssertionError as e:
        lines = (tmp_path / "serve.log").read_text().splitlines()
        said = "\n".join(line for line in lines if "rdkafka" not in line)
        raise AssertionError(f"{e}\n-- serve said:\n{said[-4000:]}") from e
    finally:
        serve.terminate()
        serve.wait(90)
        dev_stack.kafka.start()  # (up again whatever happened above)
