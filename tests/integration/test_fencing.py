"""Invariant 7: a worker paused past its session timeout loses its partitions, and
nothing it appends after that is accepted -- by epochs in the log (the default) or by
Kafka transactions."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from es_agents.core import replay
from es_agents.core.chain import Sealed, seal_runs
from es_agents.core.events import Event, ModelCallRequested
from es_agents.lab.demo import run_worker, ticket_stats
from es_agents.settings import KafkaSettings
from tests.integration.test_commands import until
from tests.integration.test_runtime import _events, _start
from tests.test_support import ROOT

pytestmark = pytest.mark.integration


def test_a_zombie_worker_cannot_append_after_losing_its_partitions(
    env: dict[str, str], kafka_settings: KafkaSettings, tickets_url: str, tmp_path: Path
) -> None:
    env = {**env, "ES_AGENTS_SESSION_TIMEOUT_MS": "6000"}
    run_id = _start(kafka_settings, "slowpoke")
    zombie = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "worker",
            "--agent",
            "tests.agents:slowpoke",
            "--instance-id",
            "zombie",
        ],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "zombie.log").open("w"),
        text=True,
    )
    zombie_log = tmp_path / "zombie.log"
    try:
        until(
            lambda: any(
                isinstance(e, ModelCallRequested)
                for e in _events(kafka_settings, run_id)
            ),
            60,
            "the first worker never started",
        )
        zombie.send_signal(signal.SIGSTOP)  # paused inside a 2 s model call

        # A second worker gets the partitions once the zombie's session expires,
        # fences its transactional producers, re-issues the dangling model call,
        # and finishes the run.
        heir = run_worker(
            env, agent="tests.agents:slowpoke", instance_id="heir", timeout=120
        )
        assert heir.returncode == 0, heir.stderr[-2000:]
        finished = _events(kafka_settings, run_id)
        assert replay(finished).status == "completed"

        zombie.send_signal(signal.SIGCONT)  # it wakes, its model call returns...
        until(  # ...it tries to append, and is refused
            lambda: any(w in zombie_log.read_text() for w in ("fenced", "not owned")),
            30,
            "the zombie was not refused",
        )
    finally:
        zombie.send_signal(signal.SIGCONT)
        zombie.terminate()
        zombie.wait(60)
    stderr = zombie_log.read_text()
    after = _events(kafka_settings, run_id)
    assert after == finished, "a fenced writer's append was accepted"
    assert "fenced" in stderr or "not owned by this worker" in stderr, stderr[-3000:]
    attempts = [e.attempt for e in after if isinstance(e, ModelCallRequested)]
    assert attempts[:2] == [1, 2]  # the zombie's request, re-issued by the heir
    assert ticket_stats(tickets_url, run_id) == {"tickets": 1, "keys": 1}


@contextmanager
def writers(kind: str, settings: KafkaSettings) -> Iterator[Callable[[str, int], Any]]:
    """Writers of one fencing kind, built like the worker builds them: each takes
    the partition's next epoch (a counter here) when it is created."""
    from es_agents.adapters.fencing import PartitionWriter  # noqa: PLC0415
    from es_agents.adapters.kafka import KafkaEventLog  # noqa: PLC0415
    from es_agents.adapters.kafka_epochs import EpochWriter  # noqa: PLC0415

    log = KafkaEventLog(settings)
    epochs = itertools.count(1)
    made: list[Any] = []

    def make(group: str, partition: int) -> Any:
        if kind == "epochs":
            writer: Any = EpochWriter(log, group, partition, lambda: next(epochs))
        else:
            writer = PartitionWriter(settings, log.codec, group, partition)
        made.append(writer)
        return writer

    try:
        yield make
    finally:
        for writer in made:
            writer.close()
        log.close()


@pytest.mark.parametrize("kind", ["epochs", "transactions"])
def test_the_older_writer_of_a_partition_is_refused(
    kafka_settings: KafkaSettings, kind: str
) -> None:
    from es_agents.adapters.kafka import KafkaEventLog  # noqa: PLC0415
    from es_agents.codec import AvroCodec  # noqa: PLC0415
    from es_agents.core.events import RunStarted, StatePatched  # noqa: PLC0415
    from es_agents.errors import FencedError  # noqa: PLC0415
    from es_agents.partitioner import partition_for  # noqa: PLC0415

    codec = AvroCodec()
    run_id = f"run-fence-{kind}-{uuid.uuid4().hex[:6]}"
    partition = partition_for(run_id, kafka_settings.partitions)
    heads: dict[str, bytes] = {}

    signer = KafkaEventLog(kafka_settings)  # signs as a worker's log does

    def sealed(event: Event) -> list[Sealed]:
        return signer.signed(seal_runs([event], codec.encode, heads))

    def patch(seq: int, key: str) -> Event:
        return StatePatched(run_id=run_id, seq=seq, step=0, key=key, value_json="1")

    with writers(kind, kafka_settings) as make:
        old = make("g", partition)
        other = make("other-agent", partition)  # another agent's group: not fenced
        old.append(
            sealed(
                RunStarted(
                    run_id=run_id,
                    seq=0,
                    step=0,
                    agent="x",
                    input_json="{}",
                    command_id="c",
                )
            )
        )
        new = make("g", partition)  # the next owner
        counted = dict(heads)
        with pytest.raises(FencedError, match="fenced"):
            old.append(sealed(patch(1, "zombie")))
        heads.update(counted)  # the zombie's event is not the chain's head
        new.append(sealed(patch(1, "owner")))
        other.append(signer.signed(seal_runs([patch(0, "other")], codec.encode, {})))
        with pytest.raises(FencedError, match="fenced"):
            old.append(sealed(patch(2, "zombie-again")))
        end = new.committed_end
    signer.close()
    log = KafkaEventLog(kafka_settings)
    try:
        events = log.read_run(run_id, at_least=end)
    finally:
        log.close()
    keys = [getattr(e, "key", None) for e in events]
    assert keys[0] is None
    assert "zombie" not in keys
    assert "zombie-again" not in keys
    assert "owner" in keys


@pytest.mark.parametrize("kind", ["epochs", "transactions"])
def test_a_writer_reads_its_own_appends_at_once(
    kafka_settings: KafkaSettings, kind: str
) -> None:
    """An append returns before a read_committed reader may see it (a commit's
    markers come a moment later); a read that asks for at least the writer's
    committed end still sees it (a run loaded right after its own worker's append)."""
    from es_agents.adapters.kafka import KafkaEventLog  # noqa: PLC0415
    from es_agents.core.events import RunStarted, StatePatched  # noqa: PLC0415
    from es_agents.errors import FencedError  # noqa: PLC0415
    from es_agents.partitioner import partition_for  # noqa: PLC0415

    run_id = f"run-read-your-writes-{kind}-{uuid.uuid4().hex[:6]}"
    partition = partition_for(run_id, kafka_settings.partitions)
    log = KafkaEventLog(kafka_settings)
    heads: dict[str, bytes] = {}

    def sealed(events: list[Event]) -> list[Sealed]:
        return log.signed(seal_runs(events, log.encode, heads))

    with writers(kind, kafka_settings) as make:
        writer = make("ryw", partition)
        try:
            writer.append(
                sealed(
                    [
                        RunStarted(
                            run_id=run_id,
                            seq=0,
                            step=0,
                            agent="x",
                            input_json="{}",
                            command_id="c",
                        )
                    ]
                )
            )
            for seq in range(1, 60):
                writer.append(
                    sealed(
                        [
                            StatePatched(
                                run_id=run_id, seq=seq, step=0, key="k", value_json="1"
                            )
                        ]
                    )
                )
                end = writer.committed_end
                seen = log.read_run(run_id, from_offset=end - 1, at_least=end)
                assert [e.seq for e in seen] == [seq]
        finally:
            writer.close()
            log.close()
        with pytest.raises(FencedError, match="closed"):  # a revoked partition's
            writer.append(
                sealed(
                    [
                        StatePatched(
                            run_id=run_id, seq=60, step=0, key="k", value_json="1"
                        )
                    ]
                )
            )


def test_a_downstream_refusing_an_old_fencing_token_leaves_the_call_to_the_owner(
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Each owner of a partition gets the next epoch, passed to tools as a fencing
    token. A call refused for an old token did not happen: its ledger claim is
    released, the worker stops that run, and the partition's next owner makes it."""
    import psycopg  # noqa: PLC0415

    from es_agents.partitioner import partition_for  # noqa: PLC0415

    run_id = _start(kafka_settings, "fenced_mailer")
    partition = partition_for(run_id, kafka_settings.partitions)
    group = f"{kafka_settings.topic_prefix}.workers.fenced_mailer"
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT epoch FROM partition_epochs WHERE group_id = %s AND partition = %s",
            (group, partition),
        ).fetchone()
    now = row[0] if row is not None else 0
    # The downstream has already seen the epoch the owner after next will take.
    fence = tmp_path / "fence.json"
    fence.write_text(json.dumps({"epochs": {str(partition): now + 2}, "sent": []}))
    env = {**env, "ES_AGENTS_TEST_FENCE": str(fence)}

    old = run_worker(env, agent="tests.agents:fenced_mailer", instance_id="fence")
    assert old.returncode == 0, old.stderr[-2000:]  # it kept serving, then idled
    assert "older than epoch" in old.stderr, old.stderr[-2000:]
    state = replay(_events(kafka_settings, run_id))
    assert type(state.pending).__name__ == "PendingToolCall"  # not called, not done
    with psycopg.connect(database_url) as conn:
        claims = conn.execute(
            "SELECT count(*) FROM effects WHERE run_id = %s", (run_id,)
        ).fetchone()
    assert claims == (0,)  # the refused call's claim was released

    owner = run_worker(env, agent="tests.agents:fenced_mailer", instance_id="fence")
    assert owner.returncode == 0, owner.stderr[-2000:]
    assert replay(_events(kafka_settings, run_id)).status == "completed"
    sent = json.loads(fence.read_text())["sent"]
    assert sent == [{"key": f"{run_id}:2", "token": f"p{partition}.e{now + 2}"}], sent
