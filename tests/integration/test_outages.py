"""A worker through outages: one whose database goes away leaves at once (crash-
only) -- it does not wait for a run stuck in a tool call to reach its step's end --
and says why with the exit code of an outage; one fenced out of its group as a
static member (what librdkafka's own rejoin can do after a coordinator moved) joins
again with a new consumer and serves on, without a restart."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer

from es_agents.client import Client
from es_agents.core import replay
from es_agents.dev import DevStack
from es_agents.lab.demo import _env
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_commands import until
from tests.integration.test_runtime import _events
from tests.test_support import ROOT, migrated_database

pytestmark = pytest.mark.integration

EXIT_UNAVAILABLE = 4


@pytest.fixture
def own_db(dev_stack: DevStack) -> Iterator[str]:
    """A database of this test alone: its connections are cut."""
    name = f"es_crash_{uuid.uuid4().hex[:10]}"
    url = migrated_database(dev_stack, name)
    yield url
    dev_stack.postgres.drop_database(name)


def test_a_worker_that_loses_its_database_leaves_at_once(
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    own_db: str,
    tmp_path: Path,
) -> None:
    database_url = own_db
    marker = tmp_path / "tool-started"
    log = tmp_path / "worker.log"
    with Client(Settings(kafka=kafka_settings, database_url=database_url)) as client:
        client.start("stuck", "{}", wait=0)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "worker",
            "--agent",
            "tests.agents:stuck",
        ],
        cwd=ROOT,
        env=_env(
            **{
                **env,
                "ES_AGENTS_DATABASE_URL": database_url,
                "ES_AGENTS_TEST_MARKER": str(marker),
            }
        ),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:
        until(
            marker.exists, 120, lambda: f"the tool started: {log.read_text()[-2000:]}"
        )
        with psycopg.connect(database_url, autocommit=True) as conn:
            ended = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert ended is not None
        assert ended[0] > 0  # the worker's connections
        cut = time.monotonic()
        code = worker.wait(60)
        took = time.monotonic() - cut
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)
    said = log.read_text(errors="replace")
    assert code == EXIT_UNAVAILABLE, said[-3000:]
    assert "unavailable: postgres" in said, said[-3000:]
    # The stuck call would hold a stopping worker up to a minute (runs end their
    # step on a stop); a crash-only exit leaves within its clients' close bound.
    assert took < 20, f"left {took:.1f} s after its database went away"


def test_a_worker_fenced_out_of_its_group_joins_again_and_serves_on(
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker.log"
    instance = f"{kafka_settings.topic_prefix}-w"
    settings = Settings(kafka=kafka_settings, database_url=database_url)
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "es_agents.cli", "worker"),
            *("--agent", "tests.agents:quick", "--instance-id", instance),
        ],
        cwd=ROOT,
        env=_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )

    def completed(run_id: str) -> bool:
        events = _events(kafka_settings, run_id)
        return bool(events) and replay(events).status == "completed"

    try:
        with Client(settings) as client:
            before = client.start("quick", "{}", wait=0).run_id
            until(lambda: completed(before), 120, lambda: log.read_text()[-2000:])
            # Another member with the worker's instance id joins: the worker's
            # consumer is fenced (a fatal error in librdkafka).
            intruder = Consumer(
                {
                    "bootstrap.servers": kafka_settings.bootstrap_servers,
                    "group.id": f"{kafka_settings.topic_prefix}.workers.quick",
                    "group.instance.id": instance,
                    "partition.assignment.strategy": "cooperative-sticky",
                    "session.timeout.ms": 45_000,
                }
            )
            intruder.subscribe([kafka_settings.commands_topic])
            deadline = time.monotonic() + 60
            while not intruder.assignment() and time.monotonic() < deadline:
                intruder.poll(0.2)
            assert intruder.assignment(), "the intruder never joined"
            until(
                lambda: "joining the group again" in log.read_text(errors="replace"),
                60,
                lambda: log.read_text()[-2000:],
            )
            intruder.close()
            after = client.start("quick", "{}", wait=0).run_id
            until(lambda: completed(after), 120, lambda: log.read_text()[-2000:])
        assert worker.poll() is None, log.read_text()[-3000:]  # never restarted
    finally:
        worker.terminate()
        worker.wait(90)
