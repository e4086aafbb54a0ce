"""Streaming on the in-memory stack: a model's answer reaches a client in pieces
while the call is in flight, between a start and an end marker; what becomes an
event is the whole completion, as without streaming; a call re-issued after the
worker died mid-stream streams again under a higher attempt; an agent that
encrypts or says stream=False does not stream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from pydantic import JsonValue

from es_agents.agent import ToolAgent
from es_agents.async_client import AsyncClient
from es_agents.client import Client
from es_agents.core.events import ModelCallRequested, ModelResponded
from es_agents.core.step import Message, ToolSpec
from es_agents.models import Completion, StreamingScriptedModel, reply
from es_agents.ports import Delta
from es_agents.testing import AgentHarness, Crashed

ANSWER = "Durable agents stream their answers while the call is in flight."


def _talker(model: Any = None, **kw: Any) -> ToolAgent:
    return ToolAgent(
        name="talker",
        system_prompt="Talk.",
        model=model or StreamingScriptedModel([reply(ANSWER)], piece_chars=7),
        **kw,
    )


def _watch(client: Client, run_id: str) -> tuple[list[Delta], threading.Thread]:
    got: list[Delta] = []
    watcher = threading.Thread(
        target=lambda: got.extend(client.stream(run_id, timeout=30)), daemon=True
    )
    watcher.start()
    return got, watcher


def test_an_answer_streams_in_pieces_and_the_event_is_whole(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_talker())
    run_id = h.start()
    client = Client(h.settings, ports=h.ports)
    got, watcher = _watch(client, run_id)
    h.run()
    watcher.join(30)
    assert not watcher.is_alive()
    assert got[0].kind == "start"
    assert got[-1].kind == "end"
    texts = [d.text for d in got if d.kind == "text"]
    assert len(texts) == (len(ANSWER) + 6) // 7  # in pieces, as the model sent them
    assert "".join(texts) == ANSWER
    assert got[-1].text == ""  # the call answered
    requested = [e for e in h.events(run_id) if isinstance(e, ModelCallRequested)]
    assert {(d.step, d.attempt) for d in got} == {(requested[0].step, 1)}
    responded = [e for e in h.events(run_id) if isinstance(e, ModelResponded)]
    assert [e.content for e in responded] == [ANSWER]


class _DiesMidStream(StreamingScriptedModel):
    """The first call dies after two pieces, as a worker killed mid-stream."""

    died = False

    async def astream(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec],
        on_text: Callable[[str], None],
    ) -> Completion:
        if not _DiesMidStream.died:
            _DiesMidStream.died = True
            on_text(ANSWER[:7])
            on_text(ANSWER[7:14])
            raise Crashed("mid-stream")
        return await super().astream(messages, params, tools, on_text)


def test_a_call_reissued_after_a_crash_streams_again_under_a_new_attempt(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    _DiesMidStream.died = False
    h = es_harness(_talker(_DiesMidStream([reply(ANSWER)], piece_chars=7)))
    run_id = h.start()
    client = Client(h.settings, ports=h.ports)
    got, watcher = _watch(client, run_id)
    with pytest.raises(Crashed):
        h.run()
    h.run()
    watcher.join(30)
    first = [d for d in got if d.attempt == 1]
    second = [d for d in got if d.attempt == 2]
    assert [d.kind for d in first] == ["start", "text", "text", "end"]
    assert "Crashed" in first[-1].text  # the first call's end says why
    assert "".join(d.text for d in second if d.kind == "text") == ANSWER
    state = h.state(run_id)
    assert state.model_calls == 1  # one recorded answer: the re-issued call's
    assert state.model_attempts == 2
    assert state.status == "completed"


def test_the_async_client_streams_too(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_talker())
    run_id = h.start()
    client = AsyncClient(h.settings, ports=h.ports)

    async def watch() -> list[Delta]:
        return [d async for d in client.stream(run_id, timeout=30)]

    worker = threading.Thread(target=h.run, daemon=True)
    worker.start()
    got = asyncio.run(watch())
    worker.join(30)
    assert "".join(d.text for d in got if d.kind == "text") == ANSWER


@pytest.mark.parametrize("quiet", [{"stream": False}, {"encrypted": True}])
def test_no_stream_when_the_agent_says_so_or_encrypts(
    es_harness: Callable[[Any], AgentHarness], quiet: dict[str, bool]
) -> None:
    h = es_harness(_talker(**quiet))
    run_id = h.start()
    h.run()
    client = Client(h.settings, ports=h.ports)
    assert list(client.stream(run_id, timeout=5)) == []
    assert h.state(run_id).status == "completed"
