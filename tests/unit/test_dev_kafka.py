"""The dev stack's Kafka: cluster ids, and the users and settings of ``--acls``."""

from __future__ import annotations

import base64
import stat
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from es_agents.cli import cli
from es_agents.dev import cluster, kafka, secured
from es_agents.dev.config import DevSettings
from es_agents.dev.process import ManagedProcess


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka's storage tool reads an id starting with ``-`` as an option (``dev up``
    failed so in CI, 1 draw in 64): such a draw is drawn again."""
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64url: "-" first
    plain = uuid.UUID(bytes=b"\x01" * 16)
    draws = iter([dashed, plain])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    made = kafka.new_cluster_id()
    assert made == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    assert len(made) == 22


def test_a_stack_with_acls_keeps_its_users_and_its_records_apart(
    tmp_path: Path,
) -> None:
    dev = DevSettings(home=tmp_path, kafka_acls=True, kafka_brokers=3)
    made = secured.passwords(dev)
    path = dev.kafka_home / "users.json"
    assert path.parent.name == "kafka-acls"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secured.passwords(dev) == made  # made once, then read
    assert len(set(made.values())) == 4
    props = secured.broker_properties(dev, node=2)
    port, controller = dev.kafka_ports(2)
    assert props["listeners"] == (
        f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}"
    )
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:es-admin"
    assert (
        f'password="{made["admin"]}"'
        in props["listener.name.controller.plain.sasl.jaas.config"]
    )
    node = kafka.DevKafka(dev, node=2)
    assert node.extra["inter.broker.listener.name"] == "SASL_PLAINTEXT"
    assert node.format_args.count("--add-scram") == 4
    worker = secured.environment(dev, "worker")
    assert worker["ES_AGENTS_SASL_USERNAME"] == "es-worker"
    assert worker["ES_AGENTS_SASL_PASSWORD"] == made["worker"]
    assert worker["ES_AGENTS_REPLICATION_FACTOR"] == "3"


def test_dev_env_names_the_roles_only_of_a_stack_with_acls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ES_AGENTS_DEV_HOME", str(tmp_path))
    runner = CliRunner()
    plain = runner.invoke(cli, ["dev", "env", "--role", "worker"])
    assert plain.exit_code == 2
    assert "dev up --acls" in plain.output
    cluster.prepare(DevSettings(home=tmp_path, kafka_acls=True))
    shown = runner.invoke(cli, ["dev", "env", "--role", "client"])
    assert shown.exit_code == 0, shown.output
    assert "export ES_AGENTS_SASL_USERNAME=es-client" in shown.output
    assert "ES_AGENTS_SECURITY_PROTOCOL=SASL_PLAINTEXT" in shown.output


def test_the_active_controller_is_the_newest_epoch_leader_of_the_running_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos run's ``kill_controller`` and the cluster test kill the node the
    quorum follows, read from the nodes' quorum-state files: a client's
    DescribeCluster names a random broker on KRaft."""
    dev = DevSettings(home=tmp_path, kafka_brokers=3)
    nodes = [kafka.DevKafka(dev, node=n) for n in (1, 2, 3)]
    # Node 1 still names its old leader (it was down through an election); node 3
    # names the newest, but is down now; node 2 follows the newest it heard of.
    for node, (leader, epoch) in zip(nodes, [(1, 4), (2, 6), (3, 7)], strict=True):
        state = node.data / "__cluster_metadata-0" / "quorum-state"
        state.parent.mkdir(parents=True)
        state.write_text(f'{{"leaderId": {leader}, "leaderEpoch": {epoch}}}')
    running = {1: 101, 2: 102, 3: None}
    by_file = {node.proc.pidfile: node.node for node in nodes}
    monkeypatch.setattr(
        ManagedProcess, "pid", lambda self: running[by_file[self.pidfile]]
    )
    assert cluster.controller_of(nodes) == 2
    running[3] = 103
    assert cluster.controller_of(nodes) == 3
    for node in nodes:
        (node.data / "__cluster_metadata-0" / "quorum-state").write_text("{}")
    with pytest.raises(RuntimeError, match="active controller"):
        cluster.controller_of(nodes)
