"""The runtime on the Postgres store (``ES_AGENTS_STORE=postgres``), with real worker
processes and no broker: SIGKILL at protocol points, a zombie fenced by the epoch
check, a killed worker's partitions taken at once, the projector and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pydantic import SecretStr

from es_agents.adapters.postgres import Database
from es_agents.app import build_client_ports
from es_agents.client import Client
from es_agents.core import replay
from es_agents.core.commands import StartRun
from es_agents.core.events import Event, ModelCallRequested
from es_agents.dev import DevStack
from es_agents.errors import ConfigError, Unavailable
from es_agents.lab.demo import cli, run_worker, ticket_stats
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_commands import until
from tests.integration.test_runtime import _emails
from tests.stalls import server_sessions, stalled_session
from tests.test_support import ROOT

pytestmark = pytest.mark.integration


@pytest.fixture
def pg(
    dev_stack: DevStack, kafka_settings: KafkaSettings, env: dict[str, str]
) -> Iterator[tuple[Settings, dict[str, str]]]:
    """A database of this test's own holding the log, and the workers' env for it."""
    name = f"es_pgstore_{uuid.uuid4().hex[:10]}"
    dev_stack.postgres.create_database(name)
    url = dev_stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    settings = Settings(
        kafka=kafka_settings, database_url=SecretStr(url), store="postgres"
    )
    try:
        yield (
            settings,
            {
                **env,
                "ES_AGENTS_STORE": "postgres",
                "ES_AGENTS_DATABASE_URL": url,
                # Kafka is not used: a wrong address proves it.
                "ES_AGENTS_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            },
        )
    finally:
        dev_stack.postgres.drop_database(name)


def _start(settings: Settings, agent: str) -> str:
    run_id = f"run-{uuid.uuid4().hex[:10]}"
    ports = build_client_ports(settings)
    try:
        ports.migrate()
        ports.ensure_topics()
        ports.log.send(StartRun(run_id=run_id, agent=agent, input_json="{}"))
    finally:
        ports.close()
    return run_id


def _events(settings: Settings, run_id: str) -> list[Event]:
    ports = build_client_ports(settings)
    try:
        return ports.log.read_run(run_id)
    finally:
        ports.close()


@pytest.mark.parametrize(
    "point",
    [
        "after_action:model@2",  # model answered, outcome not durable
        "after_action:tool@2",  # ticket created downstream, outcome not durable
        "after_append:tool_call_requested@3",  # email intention durable, no ledger
        "after_action:tool@3",  # email sent, ledger done, outcome not durable
    ],
)
def test_sigkill_at_protocol_points_then_resume(
    point: str, pg: tuple[Settings, dict[str, str]], tickets_url: str
) -> None:
    settings, env = pg
    run_id = _start(settings, "crashy")
    crashed = run_worker(
        {**env, "ES_AGENTS_CRASH_AT": point}, agent="tests.agents:crashy"
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert replay(_events(settings, run_id)).status == "running"
    done = run_worker(env, agent="tests.agents:crashy")
    assert done.returncode == 0, done.stderr[-3000:]
    state = replay(_events(settings, run_id))
    assert state.status == "completed", state.error
    assert ticket_stats(tickets_url, run_id) == {"tickets": 1, "keys": 1}
    assert _emails(settings.database_url.get_secret_value(), run_id) == 1


def _worker(
    env: dict[str, str], agent: str, instance: str, stderr: Path | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "worker",
            "--agent",
            agent,
            "--instance-id",
            instance,
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=stderr.open("w") if stderr is not None else subprocess.DEVNULL,
        text=True,
    )


def _wait_for_request(settings: Settings, run_id: str) -> None:
    until(
        lambda: any(
            isinstance(e, ModelCallRequested) for e in _events(settings, run_id)
        ),
        60,
        "the first worker never started",
    )


def test_a_paused_worker_is_fenced_by_the_epoch(
    pg: tuple[Settings, dict[str, str]], tickets_url: str, tmp_path: Path
) -> None:
    settings, env = pg
    env = {**env, "ES_AGENTS_SESSION_TIMEOUT_MS": "6000"}
    run_id = _start(settings, "slowpoke")
    log = tmp_path / "zombie.log"
    zombie = _worker(env, "tests.agents:slowpoke", "zombie", stderr=log)
    try:
        _wait_for_request(settings, run_id)
        zombie.send_signal(signal.SIGSTOP)  # paused inside a 2 s model call
        started = time.monotonic()
        heir = run_worker(
            env, agent="tests.agents:slowpoke", instance_id="heir", timeout=120
        )
        assert heir.returncode == 0, heir.stderr[-2000:]
        finished = _events(settings, run_id)
        assert replay(finished).status == "completed"
        assert time.monotonic() - started >= 6 - 1  # it waited for the lease
        zombie.send_signal(signal.SIGCONT)  # its model call returns, it appends...
        # ...and is refused: by the epoch check, or -- when it was stopped inside a
        # transaction -- the server ended that session and the zombie gives up.
        until(
            lambda: (
                any(w in log.read_text() for w in ("fenced", "not owned"))
                or zombie.poll() is not None
            ),
            30,
            "the zombie's refusal in its log",
        )
        if zombie.poll() is not None:
            assert zombie.returncode != 0
            assert "postgres" in log.read_text()
    finally:
        zombie.send_signal(signal.SIGCONT)
        zombie.terminate()
        zombie.wait(60)
    assert _events(settings, run_id) == finished, "a fenced writer's append landed"
    assert ticket_stats(tickets_url, run_id) == {"tickets": 1, "keys": 1}


def _blocked(url: str, statement: str) -> bool:
    with psycopg.connect(url) as conn:
        conn.execute("SET lock_timeout = '200ms'")
        try:
            conn.execute(statement)
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_a_session_stalled_mid_pipeline_is_ended_and_only_ours(
    pg: tuple[Settings, dict[str, str]],
) -> None:
    """The server's idle timeout never ends a session stalled between a pipeline's
    messages; a worker's or projector's database ends those of this application
    that have waited for their client too long -- and leaves everything else."""
    settings, _ = pg
    url = settings.database_url.get_secret_value()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("CREATE TABLE held (id int PRIMARY KEY)")
        admin.execute("INSERT INTO held VALUES (1), (2)")
    ours = stalled_session(url, "SELECT id FROM held WHERE id = 1 FOR SHARE")
    theirs = stalled_session(
        url, "SELECT id FROM held WHERE id = 2 FOR SHARE", app="psql"
    )
    ours_pid, theirs_pid = ours.info.backend_pid, theirs.info.backend_pid
    try:
        until(
            lambda: server_sessions(url).get(ours_pid) == ("active", "ClientRead"),
            10,
            "the stalled session waiting for its client",
        )
        time.sleep(1.0)  # the scenario: twice the server's idle-in-transaction limit
        assert server_sessions(url).get(ours_pid) == ("active", "ClientRead")
        assert _blocked(url, "UPDATE held SET id = 1 WHERE id = 1")
        db = Database(url, end_stalled=1.0)
        try:
            until(
                lambda: ours_pid not in server_sessions(url),
                20,
                "the stalled session of ours ended",
            )
            assert not _blocked(url, "UPDATE held SET id = 1 WHERE id = 1")
            assert _blocked(url, "UPDATE held SET id = 2 WHERE id = 2")  # not ours
            assert server_sessions(url).get(theirs_pid) == ("active", "ClientRead")
            with db.transaction() as conn:  # its own sessions work on
                assert conn.execute("SELECT count(*) FROM held").fetchone() == (2,)
        finally:
            db.close()
    finally:
        ours.close()
        theirs.close()


def test_a_worker_paused_mid_pipeline_does_not_stop_its_heir(
    pg: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    """A worker paused between a pipeline's messages keeps its session's locks (the
    partitions' leases and epochs here): the heir ends that session after the
    session timeout and takes the run over, instead of waiting forever."""
    settings, env = pg
    env = {**env, "ES_AGENTS_SESSION_TIMEOUT_MS": "6000"}
    url = settings.database_url.get_secret_value()
    run_id = _start(settings, "slowpoke")
    zombie = _worker(env, "tests.agents:slowpoke", "zombie", stderr=tmp_path / "z")
    try:
        _wait_for_request(settings, run_id)
        zombie.send_signal(signal.SIGSTOP)
        stalled = stalled_session(
            url,
            "SELECT partition FROM log_owners FOR SHARE",
            "SELECT partition FROM partition_epochs FOR SHARE",
        )
        try:
            heir = run_worker(
                env, agent="tests.agents:slowpoke", instance_id="heir", timeout=120
            )
            assert heir.returncode == 0, heir.stderr[-2000:]
            assert "stalled process" in heir.stderr
            assert stalled.info.backend_pid not in server_sessions(url)
        finally:
            stalled.close()
        assert replay(_events(settings, run_id)).status == "completed"
    finally:
        zombie.send_signal(signal.SIGCONT)
        zombie.terminate()
        zombie.wait(60)


def test_a_stalled_transaction_does_not_hold_its_locks_forever(
    pg: tuple[Settings, dict[str, str]],
) -> None:
    """A process stopped inside a transaction (SIGSTOP, a hung thread) keeps its row
    locks until the server ends its session: the epoch it shares is taken by the
    next owner after ``idle_in_transaction`` seconds, not never."""
    settings, _ = pg
    url = settings.database_url.get_secret_value()
    stalled, heir = (Database(url, idle_in_transaction=1.0) for _ in range(2))
    try:
        heir.migrate()
        with heir.transaction() as conn:
            conn.execute(
                "INSERT INTO partition_epochs (group_id, partition, epoch) "
                "VALUES ('g', 0, 1)"
            )
        held = stalled.transaction()
        conn = held.__enter__()
        conn.execute(
            "SELECT epoch FROM partition_epochs WHERE group_id = 'g' FOR SHARE"
        )
        started = time.monotonic()
        with heir.transaction() as other:
            other.execute("SET LOCAL lock_timeout = '20s'")
            other.execute("UPDATE partition_epochs SET epoch = 2 WHERE group_id = 'g'")
        took = time.monotonic() - started
        with pytest.raises(Unavailable):
            held.__exit__(None, None, None)  # its session is gone: nothing commits
    finally:
        stalled.close()
        heir.close()
    assert 0.5 < took < 10, took


def test_a_killed_workers_partitions_are_taken_at_once(
    pg: tuple[Settings, dict[str, str]],
) -> None:
    """A SIGKILLed member's advisory lock goes with its connection: the next worker
    does not wait for the session timeout (45 s by default)."""
    settings, env = pg
    run_id = _start(settings, "slowpoke")
    first = _worker(env, "tests.agents:slowpoke", "first")
    try:
        _wait_for_request(settings, run_id)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        started = time.monotonic()
        heir = run_worker(env, agent="tests.agents:slowpoke", instance_id="heir")
        took = time.monotonic() - started
    finally:
        first.kill()
        first.wait(30)
    assert heir.returncode == 0, heir.stderr[-2000:]
    assert replay(_events(settings, run_id)).status == "completed"
    assert took < 20, took


def test_the_projector_and_the_cli_on_the_postgres_store(
    pg: tuple[Settings, dict[str, str]],
) -> None:
    _, env = pg
    started = cli(
        env, "start", "research", "--input", '{"topic": "pg"}', "--no-wait", "--queue"
    )
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert run_worker(env, agent="tests.agents:gated").returncode == 0
    projected = cli(env, "projector", "--until-caught-up")
    assert projected.returncode == 0, projected.stderr[-2000:]
    status = cli(env, "status", run_id, "--json")
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert (view["status"], view["waiting"]) == ("paused", "awaiting_approval")
    assert view["loaded_from"]["snapshot_seq"] is not None  # from the projection
    approved = cli(env, "approve", run_id, "--by", "alice", "--no-wait")
    assert approved.returncode == 0, approved.stderr
    assert run_worker(env, agent="tests.agents:gated").returncode == 0
    runs = cli(env, "runs", "--json")
    assert runs.returncode == 0
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    final = json.loads(cli(env, "status", run_id, "--json").stdout)
    assert final["status"] == "completed"
    replayed = cli(env, "replay", run_id)
    assert replayed.returncode == 0
    assert "status=completed" in replayed.stdout


def test_one_instance_id_is_one_member(pg: tuple[Settings, dict[str, str]]) -> None:
    """A second process with the same --instance-id is refused, not left waiting."""
    settings, _ = pg
    ports = build_client_ports(settings)
    try:
        ports.migrate()
        ports.ensure_topics()
        topic, group = settings.kafka.commands_topic, "g-same"
        first = ports.subscribe(
            topic, group, ports.log.decode_command, instance_id="same"
        )
        with pytest.raises(ConfigError, match="already running"):
            ports.subscribe(topic, group, ports.log.decode_command, instance_id="same")
        first.close()
        again = ports.subscribe(
            topic, group, ports.log.decode_command, instance_id="same"
        )
        again.close()
    finally:
        ports.close()


def test_answers_stream_on_the_postgres_store(
    pg: tuple[Settings, dict[str, str]],
) -> None:
    """The deltas in the unlogged stream_deltas table, followed by the client."""
    settings, env = pg
    started = cli(env, "start", "desk", "--input", '"hi"', "--no-wait", "--queue")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    done: list[int] = []
    worker = threading.Thread(
        target=lambda: done.append(
            run_worker(env, agent="tests.agents:desk").returncode
        )
    )
    worker.start()
    with Client(settings) as client:
        got = list(client.stream(run_id, timeout=60))
    worker.join(120)
    assert done == [0]
    assert got[0].kind == "start"
    assert "".join(d.text for d in got if d.kind == "text") == "Hello! How can I help?"
    assert got[-1].kind == "end"
