"""Signed, four-eyes approvals on the real stack, from a shell: keys made and
registered with ``es-agents keys new``, decisions signed with ``approve --key``; a
worker process verifies them against ``approver_keys``. Each refused decision exits
1 with its reason and is in the run's log as ``decision_refused``."""

from __future__ import annotations

import json
import os
import subprocess
from base64 import b64decode
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from es_agents.app import build_client_ports
from es_agents.approvals import SigningKey, new_key
from es_agents.client import Client
from es_agents.codec import AvroCodec
from es_agents.core.approvals import Pause, pause_of
from es_agents.core.authorship import Authenticator
from es_agents.core.chain import digest
from es_agents.core.commands import Approve
from es_agents.core.epochs import EPOCH_HEADER
from es_agents.core.events import ApprovalRecorded, DecisionRefused, Resumed
from es_agents.core.step import args_hash
from es_agents.lab.demo import cli
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_commands import until, worker

pytestmark = pytest.mark.integration


def _out(done: subprocess.CompletedProcess[str], code: int) -> dict[str, object]:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr[-2000:])
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def _key(env: dict[str, str], path: Path, identity: str, *roles: str) -> str:
    args = ["keys", "new", "--identity", identity, "--out", str(path), "-o", "json"]
    for role in roles:
        args += ["--role", role]
    made = _out(cli(env, *args), 0)
    assert path.stat().st_mode & 0o777 == 0o600
    assert b"PRIVATE KEY" in path.read_bytes()
    return str(made["key_id"])


def test_four_eyes_signed_from_the_shell(env: dict[str, str], tmp_path: Path) -> None:
    keys = {name: tmp_path / f"{name}.key" for name in ("alice", "bob", "mallory")}
    ids = {
        "alice": _key(env, keys["alice"], "alice"),
        "bob": _key(env, keys["bob"], "bob", "finance"),
        "mallory": _key(env, keys["mallory"], "mallory"),
    }
    listed = json.loads(cli(env, "keys", "list", "-o", "json").stdout)
    mine = {k["key_id"]: k for k in listed if k["key_id"] in ids.values()}
    assert mine[ids["bob"]]["roles"] == ["finance"]
    assert not mine[ids["mallory"]]["revoked"]
    again = cli(env, "keys", "new", "--identity", "x", "--out", str(keys["bob"]))
    assert again.returncode == 2  # never overwrites a key file

    def approve(by: str, key: str | None, code: int) -> str:
        args = ["approve", run, "--by", by, "-o", "json"]
        if key is not None:
            args += ["--key", str(keys[key])]
        return str(_out(cli(env, *args), code)["reason"])

    with worker(env, "tests.secure_agents:four_eyes"):
        started = _out(cli(env, "start", "four-eyes", "-o", "json"), 0)
        run = str(started["run_id"])

        def status() -> dict[str, object]:
            return _out(cli(env, "status", run, "-o", "json"), 0)

        until(lambda: status()["status"] == "paused", what="the wire's gate")
        awaiting = status()["awaiting"]
        assert isinstance(awaiting, dict)
        assert (awaiting["tool"], awaiting["args"]) == (
            "wire",
            {"amount": 1200, "to": "ACME"},
        )
        refused = [
            approve("alice", None, 1),
            approve("mallory", "mallory", 1),
            approve("alice", "mallory", 1),
        ]
        assert "requires a signed decision" in refused[0]
        assert "'mallory' may not decide gate 'wire'" in refused[1]
        assert "belongs to 'mallory', not 'alice'" in refused[2]
        recorded = approve("alice", "alice", 0)
        assert recorded == "approval 1 of 2 recorded; the run waits for the others"
        awaiting = status()["awaiting"]
        assert isinstance(awaiting, dict)
        assert awaiting["approvals"] == ["alice"]
        refused.append(approve("alice", "alice", 1))
        assert refused[-1] == "'alice' already approved gate 'wire'"
        assert _out(cli(env, "keys", "revoke", ids["mallory"], "-o", "json"), 0)[
            "revoked"
        ]
        refused.append(approve("mallory", "mallory", 1))
        assert "revoked" in refused[-1]
        assert status()["status"] == "paused"
        assert approve("bob", "bob", 0) is not None
        until(lambda: status()["status"] == "completed", what="the run's end")
    events = [
        json.loads(line)
        for line in cli(env, "show", run, "-o", "jsonl").stdout.strip().splitlines()
    ]
    kinds = [e["type"] for e in events]
    assert kinds.count(DecisionRefused.wire_name) == len(refused)
    assert [e["reason"] for e in events if e["type"] == DecisionRefused.wire_name] == (
        refused
    )
    assert kinds.count(ApprovalRecorded.wire_name) == 1
    resumed = [e for e in events if e["type"] == Resumed.wire_name]
    assert [(e["reason"], e["by"]) for e in resumed] == [("approved", "bob")]
    assert kinds.count("tool_returned") == 1


def test_forged_altered_expired_and_replayed_decisions_on_the_real_stack(
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    """The refusals that need a hand-made command, sent to a worker process: a
    forged signature, a decision altered after signing, one for other arguments, an
    expired one, an unknown key, and a valid decision replayed on a later pause."""
    settings = Settings(kafka=kafka_settings, database_url=SecretStr(database_url))
    ports = build_client_ports(settings)
    ports.migrate()
    keys: dict[str, SigningKey] = {}
    for name, roles in (("alice", ()), ("bob", ("finance",)), ("mallory", ())):
        pem, key = new_key(name, frozenset(roles))
        ports.keyring.add(key)
        keys[name] = SigningKey.load(pem)
    ports.close()
    stranger = SigningKey.load(new_key("alice", frozenset())[0])  # not registered

    def signed(key: SigningKey, pause: Pause, by: str, **kw: Any) -> Approve:
        signature, expires = key.sign(
            pause, "approved", by, kw.pop("valid_for", timedelta(minutes=5))
        )
        return Approve(
            run_id=pause.run_id,
            by=by,
            key_id=key.key_id,
            signature=signature,
            expires_at=expires,
            **kw,
        )

    with worker(env, "tests.secure_agents:four_eyes_twice"), Client(settings) as client:
        run = client.start("four-eyes-twice").run_id

        def pause_now() -> Pause | None:
            view = client.status(run)
            return pause_of(view.state) if view.state is not None else None

        client.wait(run, until=("paused",), timeout=60)  # as a sender would
        until(lambda: pause_now() is not None, what="the first gate")
        first = pause_now()
        assert first is not None
        good = signed(keys["alice"], first, "alice")
        other_args = replace(first, args_hash=args_hash('{"amount": 1}'))
        cases = [
            (
                good.model_copy(
                    update={
                        "signature": signed(keys["mallory"], first, "alice").signature,
                        "command_id": "forged-" + run,
                    }
                ),
                "does not match",  # forged
            ),
            (
                good.model_copy(
                    update={
                        "expires_at": good.expires_at + timedelta(hours=1),  # type: ignore[operator]
                        "command_id": "altered-" + run,
                    }
                ),
                "does not match",  # altered after signing
            ),
            (signed(keys["alice"], other_args, "alice"), "does not match"),
            (
                signed(keys["alice"], first, "alice", valid_for=timedelta(seconds=-1)),
                "expired",
            ),
            (signed(stranger, first, "alice"), "unknown key"),
        ]
        for command, reason in cases:
            result = client.send(command)
            assert result.status == "refused", (reason, result)
            assert reason in (result.reason or ""), (reason, result)
        for approval in (good, signed(keys["bob"], first, "bob")):
            assert client.send(approval).status == "applied"
        until(
            lambda: (p := pause_now()) is not None and p.seq > first.seq,
            what="the second gate",
        )
        replayed = good.model_copy(update={"command_id": "replayed-" + run})
        result = client.send(replayed)
        assert result.status == "refused"
        assert "does not match" in (result.reason or "")
        client.cancel(run, by="test")
        events = client.events(run)
    refused = [e for e in events if isinstance(e, DecisionRefused)]
    assert len(refused) == len(cases) + 1


def _signed_approval(key: SigningKey, pause: Pause, by: str) -> Approve:
    signature, expires = key.sign(pause, "approved", by, timedelta(minutes=5))
    return Approve(
        run_id=pause.run_id,
        by=by,
        key_id=key.key_id,
        signature=signature,
        expires_at=expires,
    )


def _forge_approval(ports: Any, topic: str, pause: Pause, key_id: str) -> Resumed:
    """A ``resumed`` (approved by bob, his key named, the signature made up)
    appended to ``pause``'s run as a worker would: chained on the run's head, the
    owner's epoch stamp, a valid MAC under the workers' writer key."""
    run = pause.run_id
    mine = [
        r
        for r in ports.log.read_partition(topic, ports.log.partition_for(run))
        if r.key == run
    ]
    last = AvroCodec().decode_event(mine[-1].value)
    forged = Resumed(
        run_id=run,
        seq=last.seq + 1,
        step=last.step,
        prev=digest(mine[-1].value),
        reason="approved",
        by="bob",
        args_hash=pause.args_hash,
        key_id=key_id,
        signature=b"\x07" * 64,
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
    )
    value = AvroCodec().encode(forged)
    auth = Authenticator({"set": b64decode(os.environ["ES_AGENTS_WRITER_KEY"])}, "set")
    stamp = [(k, v) for k, v in mine[-1].headers if k == EPOCH_HEADER]
    ports.log.produce(topic, run, value, [*stamp, auth.header(value)])
    return forged


def test_an_approval_forged_with_the_writer_key_runs_nothing(
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Whoever holds the writer key can append a ``resumed`` that every reader takes
    as a worker's (its MAC verifies): at a gate whose policy wants signed decisions
    the approval is verified again from the log before the call runs, so a
    ``resumed`` whose signature is made up starts nothing and the run waits at the
    gate again; the approvers' own signed decisions then pay once, and ``audit``
    names the forged approval."""
    settings = Settings(kafka=kafka_settings, database_url=SecretStr(database_url))
    ports = build_client_ports(settings)
    ports.migrate()
    keys: dict[str, SigningKey] = {}
    for name, roles in (("alice", ()), ("bob", ("finance",))):
        pem, key = new_key(name, frozenset(roles))
        ports.keyring.add(key)
        keys[name] = SigningKey.load(pem)
    topic = f"{env['ES_AGENTS_TOPIC_PREFIX']}.events"
    try:
        with Client(settings) as client:

            def paused() -> Pause | None:
                state = client.status(run).state
                return pause_of(state) if state is not None else None

            with worker(env, "tests.secure_agents:four_eyes"):
                run = client.start("four-eyes").run_id
                until(lambda: paused() is not None, what="the wire's gate")
            pause = paused()
            assert pause is not None
            forged = _forge_approval(ports, topic, pause, keys["bob"].key_id)

            def voided() -> bool:
                state = client.status(run).state
                waiting = state.waiting if state is not None else None
                return waiting is not None and waiting.since_seq > forged.seq

            with worker(env, "tests.secure_agents:four_eyes"):
                until(voided, what="the gate asked again")
                state = client.status(run).state
                assert state is not None
                assert state.waiting is not None
                detail = json.loads(state.waiting.detail_json)
                assert "signature does not verify" in detail["void"], detail
                kinds = [e.wire_name for e in client.events(run)]
                assert "tool_call_requested" not in kinds, kinds
                assert kinds[-2:] == ["resumed", "interrupted"], kinds
                again = pause_of(state)
                assert again is not None
                for name in ("alice", "bob"):
                    sent = client.send(_signed_approval(keys[name], again, name))
                    assert sent.status == "applied", sent
                client.wait(run, until=("completed",), timeout=60)
            report = tmp_path / "audit.json"
            audited = cli(
                env, "audit", "--run-prefix", run, "--report", str(report), "--no-bare"
            )
            assert audited.returncode == 1, audited.stdout[-2000:]
            problems = json.loads(report.read_text())["problems"][run]
            assert any("a signed approval" in p for p in problems), problems
            kinds = [e.wire_name for e in client.events(run)]
            assert kinds.count("tool_returned") == 1, kinds
    finally:
        ports.close()
