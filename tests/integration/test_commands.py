"""Every command's fate is known to its sender, checked against what was applied;
many agents share the topics; the partition count comes from the topic; the log
never expires."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.adapters.kafka_admin import ensure_topics
from es_agents.client import Client
from es_agents.core.commands import Approve
from es_agents.errors import ConfigError
from es_agents.lab.demo import _env, cli
from es_agents.settings import KafkaSettings, Settings
from tests.test_support import ROOT

pytestmark = pytest.mark.integration


@contextmanager
def worker(
    env: dict[str, str], agent: str, *more: str
) -> Iterator[subprocess.Popen[str]]:
    """A long-running worker process (``more``: its further options), stopped with
    SIGTERM at the end. Its log goes to a file (a pipe nobody reads while it runs
    would fill up and stall it)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "es_agents.cli", "worker", "--agent", agent, *more],
            cwd=ROOT,
            env=_env(**env),
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )
        try:
            yield proc
        except BaseException:
            # The test failed while the worker ran: its log goes with the failure.
            err.flush()
            err.seek(0)
            print(f"worker {agent} log:\n{err.read()[-6000:]}", file=sys.stderr)
            raise
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            err.seek(0)
            assert proc.returncode == 0, err.read()[-3000:]


def until(
    check: Callable[[], bool],
    seconds: float = 60,
    what: str | Callable[[], str] = "",
) -> None:
    """Wait for ``check`` until a deadline; ``what`` (or what it returns, asked
    at the deadline) says in the failure what was waited for and what was seen."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {seconds} s: {said}")
        time.sleep(0.1)


def _status(env: dict[str, str], run_id: str) -> dict[str, object]:
    done = cli(env, "status", run_id, "--json")
    assert done.returncode == 0, done.stderr
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def test_every_command_gets_its_verdict(env: dict[str, str]) -> None:  # noqa: PLR0915
    pending = f"run-{uuid.uuid4().hex[:8]}"
    # A start for an agent no worker ever served is refused (a typo is not queued
    # forever), naming the served agents; nothing was sent.
    typo = cli(env, "start", "nobdy", "--run-id", f"{pending}-typo")
    assert typo.returncode == 1, typo.stderr
    assert "no worker has served agent 'nobdy'" in typo.stderr
    assert "--queue" in typo.stderr
    assert cli(env, "status", f"{pending}-typo").returncode == 3
    # With --queue it waits for one: queued, and pending.
    done = cli(env, "start", "nobody", "--run-id", pending, "--queue")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == pending
    assert "queued" in done.stderr
    assert "no worker serves agent 'nobody'" in done.stderr
    assert _status(env, pending)["status"] == "pending"
    # The same id again, even for another agent: refused at once.
    done = cli(env, "start", "research", "--run-id", pending, "--queue")
    assert done.returncode == 1
    assert f"run {pending} is already pending" in done.stderr
    # A pending run can be cancelled: queued until its worker comes.
    done = cli(env, "cancel", pending, "--by", "ops")
    assert done.returncode == 0, done.stderr
    assert "queued" in done.stderr
    # A decision for a run that does not exist.
    done = cli(env, "approve", "run-nope", "--by", "ann")
    assert done.returncode == 3  # not found
    assert "not found: unknown run run-nope" in done.stderr
    done = cli(env, "status", "run-nope")
    assert done.returncode == 3
    assert "unknown run run-nope" in done.stderr

    with worker(env, "tests.agents:gated"):
        done = cli(env, "start", "research", "--input", '{"topic": "x"}')
        assert done.returncode == 0, done.stderr
        run = done.stdout.strip()
        until(lambda: _status(env, run)["status"] == "paused", what="gate")
        assert _status(env, run)["gate"] == "create_ticket"
        done = cli(env, "approve", run, "--by", "ann", "--gate", "nope")
        assert done.returncode == 1
        assert "agent 'research' has no gate 'nope'" in done.stderr
        done = cli(env, "provide-input", run, "--by", "ann", "--input", "not json")
        assert done.returncode == 2
        assert "not JSON" in done.stderr
        done = cli(env, "provide-input", run, "--by", "ann", "--input", "{}")
        assert done.returncode == 1
        assert "not waiting for input" in done.stderr
        done = cli(env, "start", "research", "--run-id", run)
        assert done.returncode == 1
        assert f"run {run} already exists" in done.stderr
        done = cli(env, "approve", run, "--by", "ann")
        assert done.returncode == 0, done.stderr
        assert f"approve {run}: applied" in done.stderr
        until(lambda: _status(env, run)["status"] == "completed", what="complete")

        # A waiting run can always be cancelled; then it is cancelled for good.
        done = cli(env, "start", "research", "--input", '{"topic": "y"}')
        other = done.stdout.strip()
        until(lambda: _status(env, other)["status"] == "paused", what="gate")
        done = cli(env, "cancel", other, "--by", "bob", "--reason", "not needed")
        assert done.returncode == 0, done.stderr
        assert "applied" in done.stderr
        assert _status(env, other)["status"] == "cancelled"
        done = cli(env, "approve", other, "--by", "ann")
        assert done.returncode == 1
        assert f"run {other} is cancelled" in done.stderr
        # A command sent past the client's checks is refused by the worker, and
        # the refusal shows on the run.
        log = KafkaEventLog(_kafka(env))
        try:
            log.send(Approve(run_id=other, by="mallory", command_id="sneaky"))
        finally:
            log.close()
        until(
            lambda: bool(_status(env, other).get("refused_commands")),
            what="refusal",
        )
        refused = _status(env, other)["refused_commands"]
        assert isinstance(refused, list)
        assert refused[0]["command_id"] == "sneaky"
        assert refused[0]["reason"] == f"run {other} is cancelled"


def _kafka(env: dict[str, str]) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=env["ES_AGENTS_BOOTSTRAP_SERVERS"],
        topic_prefix=env["ES_AGENTS_TOPIC_PREFIX"],
        partitions=int(env["ES_AGENTS_PARTITIONS"]),
    )


def test_many_agents_share_the_topics(env: dict[str, str], database_url: str) -> None:
    settings = Settings(kafka=_kafka(env), database_url=database_url)
    with Client(settings) as client:
        late = [client.start(agent, wait=5) for agent in ("quick", "quick-other")]
        assert [r.status for r in late] == ["queued"] * 2
        assert "no worker serves agent 'quick-other'" in (late[1].reason or "")
        with worker(env, "tests.agents:quick"), worker(env, "tests.agents:quick_other"):
            # Both queued starts completing shows both workers serve their agent.
            for r in late:
                until(lambda r=r: client.status(r.run_id).status == "completed", 90)  # type: ignore[misc]
            results = [
                client.start(agent, wait=30)
                for _ in range(8)
                for agent in ("quick", "quick-other")
            ]
            assert [r.status for r in results] == ["applied"] * 16, results
            for r in results:
                until(lambda r=r: client.status(r.run_id).status == "completed")  # type: ignore[misc]
                assert client.status(r.run_id).agent == r.command.agent  # type: ignore[attr-defined]


def test_the_partition_count_comes_from_the_topic(
    env: dict[str, str], database_url: str
) -> None:
    kafka = _kafka(env).model_copy(
        update={
            "topic_prefix": env["ES_AGENTS_TOPIC_PREFIX"] + ".p12",
            "partitions": 12,
        }
    )
    assert ensure_topics(kafka)[kafka.events_topic] == 12
    wrong = kafka.model_copy(update={"partitions": 5})  # what a client was told
    runs: list[str] = []
    with Client(Settings(kafka=kafka, database_url=database_url)) as client:
        runs = [client.start("quick", wait=0).run_id for _ in range(12)]
    env12 = {**env, "ES_AGENTS_TOPIC_PREFIX": kafka.topic_prefix}
    with (
        worker(env12, "tests.agents:quick"),
        Client(Settings(kafka=wrong, database_url=database_url)) as client,
    ):
        for run in runs:
            until(lambda run=run: client.status(run).status == "completed")  # type: ignore[misc]


def test_topics_never_expire(env: dict[str, str]) -> None:
    kafka = _kafka(env)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    configs = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, kafka.events_topic)]
    )
    entries = next(iter(configs.values())).result(10)
    assert entries["retention.ms"].value == "-1"
    assert entries["retention.bytes"].value == "-1"
    # Topics someone else created with the broker's 7-day default are refused.
    finite = kafka.model_copy(
        update={"topic_prefix": kafka.topic_prefix + ".finite", "partitions": 2}
    )
    created = admin.create_topics(
        [
            NewTopic(t, 2, 1, config={"retention.ms": "604800000"})
            for t in (finite.commands_topic, finite.events_topic, finite.dlq_topic)
        ]
    )
    for future in created.values():
        future.result(30)
    with pytest.raises(ConfigError, match=r"retention\.ms=604800000"):
        ensure_topics(finite)
    fenv = {**env, "ES_AGENTS_TOPIC_PREFIX": finite.topic_prefix}
    done = cli(fenv, "worker", "--agent", "tests.agents:quick", "--until-idle")
    assert done.returncode == 2
    assert "es-agents topics --fix-retention" in done.stderr
    done = cli(fenv, "topics", "--fix-retention")
    assert done.returncode == 0, done.stderr
    ensure_topics(finite)  # now accepted
