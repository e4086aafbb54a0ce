"""A resumed run's transcript is read when asked for, and a model call's request
hash extends the snapshot's chain instead of hashing the conversation again."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from es_agents.agent import ToolAgent
from es_agents.core.snapshot import from_snapshot, to_snapshot
from es_agents.core.state import RunState
from es_agents.core.step import CallModel, request_hash
from es_agents.core.transcript import (
    CHUNK,
    EMPTY_CHAIN,
    Conversation,
    Message,
    Transcript,
    extend_chain,
)
from es_agents.errors import Unavailable
from es_agents.models import ScriptedModel, reply
from es_agents.testing import AgentHarness

HEAD: list[Message] = [{"role": "system", "content": "be brief"}]


def _messages(count: int) -> list[Message]:
    return [
        {"role": "user" if n % 2 else "assistant", "content": f"message {n}"}
        for n in range(count)
    ]


class Chunks:
    """Stored chunks, and every read asked of them."""

    def __init__(self, messages: list[Message]) -> None:
        self.chunks = [messages[n : n + CHUNK] for n in range(0, len(messages), CHUNK)]
        self.reads: list[tuple[int, int]] = []
        self.gone: set[int] = set()  # chunks lost from the store

    def __call__(self, first: int, last: int) -> list[tuple[int, list[Message]]]:
        self.reads.append((first, last))
        return [
            (n, list(self.chunks[n]))
            for n in range(first, last)
            if n < len(self.chunks) and n not in self.gone
        ]


def _stored(messages: list[Message], chain: bool = True) -> tuple[Transcript, Chunks]:
    chunks = Chunks(messages)
    recorded = extend_chain(EMPTY_CHAIN, messages) if chain else None
    last = (len(messages) - 1) // CHUNK
    return (
        Transcript.stored(len(messages), chunks, recorded, {last: chunks.chunks[last]}),
        chunks,
    )


def test_a_stored_transcript_reads_a_chunk_only_when_a_message_in_it_is_asked_for() -> (
    None
):
    messages = _messages(5 * CHUNK + 3)
    transcript, chunks = _stored(messages)
    assert len(transcript) == len(messages)
    assert transcript[-1] == messages[-1]  # the last chunk came with the snapshot
    assert chunks.reads == []
    assert transcript[CHUNK + 1] == messages[CHUNK + 1]
    assert chunks.reads == [(1, 2)]
    assert list(transcript) == messages  # the rest, in one read
    assert chunks.reads == [(1, 2), (0, 5)]


def test_the_request_hash_extends_the_recorded_chain_without_reading_messages() -> None:
    messages = _messages(3 * CHUNK)
    lazy, chunks = _stored(messages)
    whole = Transcript(messages)
    for transcript in (lazy, whole):
        transcript.append({"role": "tool", "content": "new"})
    step = CallModel(Conversation(HEAD, lazy), {"temperature": 0}, ())
    same = CallModel(Conversation(HEAD, whole), {"temperature": 0}, ())
    assert request_hash(step, "m") == request_hash(same, "m")
    assert chunks.reads == []  # hashed from the recorded chain and the new message
    other = Transcript([*messages[:-1], {"role": "user", "content": "changed"}])
    other.append({"role": "tool", "content": "new"})
    changed = CallModel(Conversation(HEAD, other), {"temperature": 0}, ())
    assert request_hash(changed, "m") != request_hash(same, "m")
    assert request_hash(step, "other-model") != request_hash(same, "m")


def test_without_a_recorded_chain_the_messages_are_read_at_once_and_hashed() -> None:
    messages = _messages(2 * CHUNK + 1)
    lazy, chunks = _stored(messages, chain=False)
    assert lazy.chain() == extend_chain(EMPTY_CHAIN, messages)
    assert chunks.reads == [(0, 2)]


def test_a_snapshot_records_the_chain_and_a_lazy_load_equals_the_whole() -> None:
    messages = _messages(2 * CHUNK + 5)
    state = RunState(run_id="r", agent="a", seq=9, transcript=Transcript(messages))
    data = to_snapshot(state, inline=False)
    assert data["transcript_chain"] == extend_chain(EMPTY_CHAIN, messages).hex()
    chunks = Chunks(messages)
    lazy = from_snapshot(data, [chunks.chunks[-1]], chunks)
    eager = from_snapshot(data, chunks.chunks)
    assert lazy.transcript.chain() == eager.transcript.chain()
    assert chunks.reads == []
    assert lazy == eager == state
    assert copy.deepcopy(lazy) == state


def test_a_mapped_transcript_changes_stored_messages_when_read_and_rehashes() -> None:
    messages = _messages(CHUNK + 2)
    lazy, _ = _stored(messages)

    def shout(m: Message) -> Message:
        return {**m, "content": str(m["content"]).upper()}

    loud = lazy.mapped(shout)
    assert list(loud) == [shout(m) for m in messages]
    assert loud.chain() == extend_chain(EMPTY_CHAIN, [shout(m) for m in messages])


def test_chunks_missing_from_the_store_are_an_error_not_a_short_transcript() -> None:
    messages = _messages(3 * CHUNK)
    chunks = Chunks(messages)
    chunks.gone.add(1)  # the middle chunk is gone: the last does not take its place
    transcript = Transcript.stored(len(messages), chunks)
    with pytest.raises(ValueError, match="chunk 1 holds 0"):
        list(transcript)


def test_a_conversation_reads_as_its_head_then_the_transcript() -> None:
    messages = _messages(3)
    conversation = Conversation(HEAD, Transcript(messages))
    assert list(conversation) == [*HEAD, *messages]
    assert conversation[0] == HEAD[0]
    assert conversation[-1] == messages[-1]
    assert conversation == [*HEAD, *messages]
    assert len(conversation) == 4


def test_a_store_that_fails_to_read_the_conversation_is_not_the_models_failure(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    """The stored messages are read after the intention is durable and before the
    model is called: a database outage there stops the worker (crash-only, the run
    resumes later), never counts as the model's failure, which would end the run."""

    def unreachable(first: int, last: int) -> list[tuple[int, list[Message]]]:
        raise Unavailable("postgres went away")

    class Stored(ToolAgent):
        def messages(self, state: RunState) -> Conversation:
            recorded = extend_chain(EMPTY_CHAIN, _messages(3))  # as a snapshot has it
            return Conversation(HEAD, Transcript.stored(3, unreachable, recorded))

    model = ScriptedModel([reply("never")])
    harness = es_harness(Stored(name="stored", system_prompt="s", model=model))
    run_id = harness.start()
    with pytest.raises(Unavailable, match="postgres went away"):
        harness.run()
    assert model.calls == []  # the model was not asked
    kinds = [e.wire_name for e in harness.events(run_id)]
    assert kinds[-1] == "model_call_requested"  # durable; no run_failed
