"""A run's transcript, and the conversation a model call sends.

The transcript is the one part of a run's state that grows with the run, and the
fold only appends to it. The projector stores it in chunks of ``CHUNK`` messages
and a snapshot names its length and the *chain* of its messages (each message's
canonical JSON hashed after the previous link). A run resumed from a snapshot does
not read the conversation: a message is read from its chunk when something asks for
it (the planner looks at the last one; a model is sent all of them, after the call's
intention is durable), and the request hash of the next model call extends the
stored chain by the messages since. So resuming a run of 10,000 steps costs what
resuming a run of ten does (invariant 6).

A request's hash covers the model, its tools and parameters, the messages the
planner puts first, and the chain of the transcript that follows them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

import orjson
from pydantic import JsonValue

Message = dict[str, JsonValue]
# The stored chunks numbered ``first`` (inclusive) to ``last`` (exclusive), each as
# (its number, its messages); a chunk that is not stored is left out.
ChunkLoader = Callable[[int, int], list[tuple[int, list[Message]]]]

CHUNK = 64  # transcript messages per stored chunk
EMPTY_CHAIN = bytes(32)  # the chain of no messages


def canonical_bytes(value: object) -> bytes:
    """JSON with sorted keys and no spaces, UTF-8 (what ``canonical_json`` writes):
    orjson when it can (twenty times faster), ``json`` for what orjson refuses
    (keys that are not strings, integers beyond 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return text.encode()


def extend_chain(chain: bytes, messages: Iterable[Message]) -> bytes:
    """The chain after ``messages``: each link hashes the previous one and the
    message's canonical JSON."""
    for message in messages:
        chain = hashlib.sha256(chain + canonical_bytes(message)).digest()
    return chain


class Transcript(Sequence[Message]):
    """The messages of a run, some of them perhaps still in their stored chunks."""

    __slots__ = ("_chain", "_chain_len", "_chunks", "_load", "_stored", "_tail")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._stored = 0  # messages still in stored chunks (read on demand)
        self._chunks: dict[int, list[Message]] = {}
        self._load: ChunkLoader | None = None
        self._tail: list[Message] = list(messages)
        self._chain_len = 0  # how many leading messages ``_chain`` covers
        self._chain = EMPTY_CHAIN

    @classmethod
    def stored(
        cls,
        length: int,
        load: ChunkLoader,
        chain: bytes | None = None,
        chunks: dict[int, list[Message]] | None = None,
    ) -> Transcript:
        """``length`` messages in stored chunks, read by ``load`` when asked for;
        ``chain``: theirs, as the snapshot recorded it; ``chunks``: already read."""
        made = cls()
        made._stored = length
        made._load = load
        made._chunks = dict(chunks or {})
        if chain is not None:
            made.seed_chain(length, chain)
        return made

    # -- reading ------------------------------------------------------------------
    def __len__(self) -> int:
        return self._stored + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = _position(index, len(self))
        if index >= self._stored:
            return self._tail[index - self._stored]
        number = index // CHUNK
        if number not in self._chunks:
            self._read(number, number + 1)
        return self._chunks[number][index - number * CHUNK]

    def __iter__(self) -> Iterator[Message]:
        self._materialize()
        return iter(self._tail)

    def read_all(self) -> None:
        """Every stored message read now, in one call."""
        self._materialize()

    def unread(self) -> int:
        """How many messages are still in stored chunks not read yet."""
        count = (self._stored + CHUNK - 1) // CHUNK
        return sum(
            min(CHUNK, self._stored - n * CHUNK)
            for n in range(count)
            if n not in self._chunks
        )

    def _read(self, first: int, last: int) -> None:
        if self._load is None:
            raise ValueError("a stored transcript without a way to read it")
        for number, messages in self._load(first, last):
            self._chunks[number] = messages
        for number in range(first, last):
            held = len(self._chunks.get(number, ()))
            wanted = min(CHUNK, self._stored - number * CHUNK)
            if held < wanted:
                raise ValueError(
                    f"transcript of {self._stored} messages: chunk {number} holds "
                    f"{held} of them, {wanted} expected"
                )

    def _materialize(self) -> None:
        """Every stored message read (in one call) and held in memory."""
        if self._stored == 0:
            return
        count = (self._stored + CHUNK - 1) // CHUNK
        missing = [n for n in range(count) if n not in self._chunks]
        if missing:
            self._read(missing[0], missing[-1] + 1)
        head = [m for n in range(count) for m in self._chunks[n]][: self._stored]
        self._tail = head + self._tail
        self._stored, self._chunks, self._load = 0, {}, None

    # -- growing and hashing ------------------------------------------------------
    def append(self, message: Message) -> None:
        self._tail.append(message)

    def chain(self) -> bytes:
        """The chain of every message, extended from where it was last computed
        (a snapshot's chain: by the messages since)."""
        size = len(self)
        if self._chain_len < self._stored:  # no recorded chain: read them at once
            self._materialize()
        if self._chain_len < size:
            self._chain = extend_chain(
                self._chain, (self[i] for i in range(self._chain_len, size))
            )
            self._chain_len = size
        return self._chain

    def seed_chain(self, length: int, chain: bytes) -> None:
        """The chain of the first ``length`` messages, as recorded."""
        self._chain_len, self._chain = length, chain

    def mapped(self, change: Callable[[Message], Message]) -> Transcript:
        """Every message passed through ``change`` (stored ones when read); the
        chain is computed again, over the changed messages."""
        made = Transcript(change(m) for m in self._tail)
        if self._stored and self._load is not None:
            made._stored, made._load = self._stored, _changing(self._load, change)
            made._chunks = {
                n: [change(m) for m in chunk] for n, chunk in self._chunks.items()
            }
        return made

    # -- as a value ---------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Transcript, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))

    def __deepcopy__(self, memo: dict[int, Any]) -> Transcript:
        made = Transcript(copy.deepcopy(self._tail, memo))
        made._stored, made._load = self._stored, self._load  # chunks never change
        made._chunks = copy.deepcopy(self._chunks, memo)
        made._chain_len, made._chain = self._chain_len, self._chain
        return made


def _position(index: int, size: int) -> int:
    """``index`` of a sequence of ``size`` items, counted from the start."""
    position = index + size if index < 0 else index
    if not 0 <= position < size:
        raise IndexError("message index out of range")
    return position


def _changing(load: ChunkLoader, change: Callable[[Message], Message]) -> ChunkLoader:
    def read(first: int, last: int) -> list[tuple[int, list[Message]]]:
        return [(n, [change(m) for m in chunk]) for n, chunk in load(first, last)]

    return read


class Conversation(Sequence[Message]):
    """What a model call sends: the planner's leading messages (``head``), then the
    run's transcript -- read when a model is sent it, not before -- then the
    planner's trailing messages (``tail``: e.g. why its last answer did not do)."""

    __slots__ = ("head", "tail", "transcript")

    def __init__(
        self,
        head: Sequence[Message],
        transcript: Transcript,
        tail: Sequence[Message] = (),
    ) -> None:
        self.head = list(head)
        self.transcript = transcript
        self.tail = list(tail)

    def __len__(self) -> int:
        return len(self.head) + len(self.transcript) + len(self.tail)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = _position(index, len(self))
        if index < len(self.head):
            return self.head[index]
        index -= len(self.head)
        if index < len(self.transcript):
            return self.transcript[index]
        return self.tail[index - len(self.transcript)]

    def __iter__(self) -> Iterator[Message]:
        yield from self.head
        yield from self.transcript
        yield from self.tail

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Sequence)) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Conversation({self.head!r}, {self.transcript!r}, {self.tail!r})"
