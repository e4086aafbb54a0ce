"""Encrypted payloads on the in-memory stack: what the log holds, what a reader with
the run's key gets back, and what is left after the key is destroyed."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, JsonValue, SecretStr

from es_agents.agent import ToolAgent
from es_agents.client import Client
from es_agents.core.approvals import pause_of
from es_agents.core.commands import ProvideInput
from es_agents.core.events import (
    Interrupted,
    ModelResponded,
    RunStarted,
    ToolCallRequested,
    ToolReturned,
)
from es_agents.core.state import RunState
from es_agents.core.step import Finish, Interrupt, Step, args_hash
from es_agents.errors import ConfigError
from es_agents.models import ScriptedModel, call, reply
from es_agents.testing import AgentHarness
from es_agents.tools import ToolContext, tool
from es_agents.vault import (
    FORGOTTEN,
    PREFIX,
    Cipher,
    MemoryVault,
    encrypted,
    load_master_key,
    new_master_key,
    unwrap,
    wrap,
)


class Note(BaseModel):
    text: str


@tool(Note)
def save(args: Note, ctx: ToolContext) -> JsonValue:
    """Saves a note."""
    return {"saved": args.text}


@tool(Note, requires_approval=True)
def publish(args: Note, ctx: ToolContext) -> JsonValue:
    """Publishes a note (after approval)."""
    return {"published": args.text}


def _agent() -> ToolAgent:
    return ToolAgent(
        name="diarist",
        system_prompt="Save, then publish.",
        model=ScriptedModel(
            [
                call("save", "s1", text="dear diary"),
                call("publish", "p1", text="dear world"),
                reply("all done"),
            ]
        ),
        tool_list=[save, publish],
        encrypted=True,
    )


def test_the_log_holds_ciphertext_and_the_key_reads_it_back(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent())
    run_id = h.start('{"about": "my day"}')
    h.run()
    events = h.events(run_id)
    started = next(e for e in events if isinstance(e, RunStarted))
    responded = next(e for e in events if isinstance(e, ModelResponded))
    requested = next(e for e in events if isinstance(e, ToolCallRequested))
    returned = next(e for e in events if isinstance(e, ToolReturned))
    paused = next(e for e in events if isinstance(e, Interrupted))
    for text in (
        started.input_json,
        responded.tool_calls[0].args_json,
        requested.args_json,
        returned.result_json or "",
    ):
        assert text.startswith(PREFIX), text
    assert "dear" not in paused.detail_json
    raw = h.state(run_id)  # the fold of the log as written: what projections hold
    assert encrypted(raw)
    assert "dear" not in repr(raw)
    cipher = Cipher(h.ports.vault)
    state = cipher.reveal(run_id, raw)
    assert state.input_json == '{"about": "my day"}'
    assert not encrypted(state)
    pause = pause_of(state)  # what an approver signs: the plain arguments' hash
    assert pause is not None
    assert pause.args_hash == args_hash('{"text": "dear world"}')
    h.approve(run_id)
    h.run()
    done = cipher.reveal(run_id, h.state(run_id))
    assert done.status == "completed"
    assert '"published":"dear world"' in repr(done.transcript)

    assert h.ports.vault.forget(run_id)
    cipher.evict(run_id)
    gone = cipher.reveal(run_id, h.state(run_id))
    assert gone.status == "completed"
    assert gone.input_json == FORGOTTEN
    assert "dear" not in repr(gone)


def test_a_payload_opens_only_under_its_own_run() -> None:
    cipher = Cipher(MemoryVault())
    sealed = cipher.encrypt_text("run-a", "hello")
    assert cipher.encrypt_text("run-a", sealed) == sealed  # not encrypted twice
    assert cipher.decrypt_text("run-a", sealed) == "hello"
    moved = cipher.encrypt_text("run-b", "x")  # run-b gets a key
    assert moved != sealed
    with pytest.raises(ConfigError, match="does not decrypt"):
        cipher.decrypt_text("run-b", sealed)


def test_the_master_key_wraps_data_keys() -> None:
    master = load_master_key(base64.b64encode(bytes(range(32))).decode(), None)
    assert master is not None
    wrapped = wrap(master, "run-a", b"k" * 32)
    assert unwrap(master, "run-a", wrapped) == b"k" * 32
    with pytest.raises(ConfigError, match="another ES_AGENTS_MASTER_KEY"):
        unwrap(bytes(32), "run-a", wrapped)
    with pytest.raises(ConfigError, match="32 bytes"):
        load_master_key(base64.b64encode(b"short").decode(), None)


class Asker:
    """Asks a person for input, then finishes with it; its payloads encrypted."""

    name = "asker"
    model = None
    tools: dict[str, Any] = {}  # noqa: RUF012 - read-only
    encrypted = True

    def plan(self, state: RunState) -> Step:
        if state.last_resume is not None and state.last_resume.input_json:
            return Finish({"heard": state.last_resume.input_json})
        return Interrupt("awaiting_input", detail={"question": "your secret?"})

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "asker@1"}


def test_a_clients_input_travels_encrypted_and_comes_back_plain(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(Asker())
    settings = h.settings.model_copy(update={"master_key": SecretStr(new_master_key())})
    client = Client(settings, ports=h.ports)
    started = client.start("asker", '{"topic": "sealed start"}', wait=0)
    run_id = started.run_id
    h.run()
    answer = client.provide_input(run_id, "ann", '{"pin": "4242"}', wait=0)
    assert answer.status == "queued"
    assert isinstance(answer.command, ProvideInput)
    assert answer.command.input_json.startswith(PREFIX)  # encrypted by the client
    h.run()
    events = h.events(run_id)
    assert all("4242" not in repr(e) and "sealed start" not in repr(e) for e in events)
    view = client.status(run_id)
    assert view.status == "completed"
    assert view.state is not None
    assert "4242" in (view.state.output_json or "")  # the client reveals it
