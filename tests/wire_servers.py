"""Local model servers that speak the OpenAI Chat Completions and the Anthropic
Messages wire formats strictly.

Each request body is validated against the SDK's own request type
(``CompletionCreateParamsNonStreaming``, ``MessageCreateParamsNonStreaming``), every
nested iterable included; a body that does not validate gets a 400 with the errors.
Answers follow a script like ``ScriptedModel``'s (turn n = the number of assistant
messages in the request), built with the SDK's own response types. Faults queued with
``fail_next`` are served first: an HTTP status with headers, a malformed body, or a
slow answer.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from es_agents.models import Completion

Wire = Literal["openai", "anthropic"]


def _force(value: Any) -> Any:
    """Validate lazily validated iterables by walking them."""
    if isinstance(value, dict):
        return {k: _force(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ValidatorIterator":
        return [_force(v) for v in value]
    return value


def _validator(wire: Wire, stream: bool = False) -> TypeAdapter[Any]:
    if wire == "openai":
        from openai.types.chat.completion_create_params import (  # noqa: PLC0415
            CompletionCreateParamsNonStreaming,
            CompletionCreateParamsStreaming,
        )

        if stream:
            return TypeAdapter(CompletionCreateParamsStreaming)
        return TypeAdapter(CompletionCreateParamsNonStreaming)
    from anthropic.types.message_create_params import (  # noqa: PLC0415
        MessageCreateParamsNonStreaming,
        MessageCreateParamsStreaming,
    )

    if stream:
        return TypeAdapter(MessageCreateParamsStreaming)
    return TypeAdapter(MessageCreateParamsNonStreaming)


# Built once per process, when this module is imported (at collection): building
# them took 1-2 s in a fresh process but once over nine minutes in a pytest process
# that had run hundreds of tests (its stacks showed pydantic still generating the
# request schema), ending in the test timeout. Built before any test, the schema
# generation never runs in a long-lived process again.
_VALIDATORS: dict[tuple[Wire, bool], TypeAdapter[Any]] = {
    (wire, stream): _validator(wire, stream)
    for wire in ("openai", "anthropic")
    for stream in (False, True)
}


@dataclass
class Fault:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # raw body (malformed answers)
    delay: float = 0.0  # seconds before answering (then the scripted answer)


@dataclass
class WireServer:
    wire: Wire
    script: list[Completion]
    served_model: str = "served-model-1"
    requests: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Streamed answers: the text in pieces of this many characters, this long apart;
    # when each piece was sent (time.time(), text).
    piece_chars: int = 8
    piece_gap: float = 0.0
    sent: list[tuple[float, str]] = field(default_factory=list)
    # Answers wait for this (clear it to hold the calls in flight, set to let go).
    gate: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.gate.set()

    def fail_next(self, *faults: Fault) -> None:
        with self.lock:
            self.faults.extend(faults)

    def completion(self, body: dict[str, Any]) -> Completion:
        messages = body.get("messages") or []
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn >= len(self.script):
            return Completion(content="(no more turns)")
        return self.script[turn]

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        done = self.completion(body)
        return (
            _openai(done, self.served_model)
            if self.wire == "openai"
            else (_anthropic(done, self.served_model))
        )

    def pieces(self, text: str | None) -> list[str]:
        n = self.piece_chars
        return [text[i : i + n] for i in range(0, len(text or ""), n)] if text else []


def _openai(c: Completion, model: str) -> dict[str, Any]:
    from openai.types.chat import ChatCompletion  # noqa: PLC0415

    calls = [
        {
            "id": t.call_id,
            "type": "function",
            "function": {"name": t.name, "arguments": t.args_json},
        }
        for t in c.tool_calls
    ]
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    if calls:
        message["tool_calls"] = calls
    response = ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }
    )
    return response.model_dump(mode="json", exclude_none=True)


def _anthropic(c: Completion, model: str) -> dict[str, Any]:
    from anthropic.types import Message  # noqa: PLC0415

    blocks: list[dict[str, Any]] = []
    if c.content:
        blocks.append({"type": "text", "text": c.content})
    blocks += [
        {
            "type": "tool_use",
            "id": t.call_id,
            "name": t.name,
            "input": json.loads(t.args_json),
        }
        for t in c.tool_calls
    ]
    response = Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": "tool_use" if c.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 7},
        }
    )
    return response.model_dump(mode="json", exclude_none=True)


def _openai_chunks(
    server: WireServer, c: Completion
) -> Iterator[tuple[dict[str, Any], str]]:
    """The Chat Completions stream of ``c``: (chunk, text piece) pairs, validated
    with the SDK's chunk type; usage last (``stream_options.include_usage``)."""
    from openai.types.chat import ChatCompletionChunk  # noqa: PLC0415

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> Any:
        value = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": server.served_model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **more,
        }
        return ChatCompletionChunk.model_validate(value).model_dump(
            mode="json", exclude_none=True
        )

    yield chunk({"role": "assistant", "content": ""}), ""
    for piece in server.pieces(c.content):
        yield chunk({"content": piece}), piece
    for i, t in enumerate(c.tool_calls):
        head = {"index": i, "id": t.call_id, "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": t.name}}]}), ""
        for piece in server.pieces(t.args_json):
            call = {"index": i, "function": {"arguments": piece}}
            yield chunk({"tool_calls": [call]}), ""
    yield chunk({}, "tool_calls" if c.tool_calls else "stop"), ""
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    last = chunk({}, None, usage=usage)
    last["choices"] = []
    yield last, ""


def _anthropic_events(
    server: WireServer, c: Completion
) -> Iterator[tuple[dict[str, Any], str]]:
    """The Messages stream of ``c``, each event validated with the SDK's type."""
    from anthropic.types import RawMessageStreamEvent  # noqa: PLC0415

    check: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)

    def event(value: dict[str, Any]) -> dict[str, Any]:
        parsed = check.validate_python(value)
        dumped: dict[str, Any] = parsed.model_dump(mode="json", exclude_none=True)
        return dumped

    yield event({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant",
        "model": server.served_model, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 11, "output_tokens": 1},
    }}), ""  # fmt: skip
    index = 0
    if c.content:
        text = {"type": "text", "text": ""}
        yield (
            event({"type": "content_block_start", "index": 0, "content_block": text}),
            "",
        )
        for piece in server.pieces(c.content):
            delta = {"type": "text_delta", "text": piece}
            yield (
                event({"type": "content_block_delta", "index": 0, "delta": delta}),
                piece,
            )
        yield event({"type": "content_block_stop", "index": 0}), ""
        index = 1
    for i, t in enumerate(c.tool_calls, start=index):
        block: dict[str, Any] = {
            "type": "tool_use", "id": t.call_id, "name": t.name, "input": {},
        }  # fmt: skip
        yield (
            event({"type": "content_block_start", "index": i, "content_block": block}),
            "",
        )
        for piece in server.pieces(t.args_json):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield event({"type": "content_block_delta", "index": i, "delta": delta}), ""
        yield event({"type": "content_block_stop", "index": i}), ""
    stop = "tool_use" if c.tool_calls else "end_turn"
    yield event({"type": "message_delta", "delta": {
        "stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 7},
    }), ""  # fmt: skip
    yield event({"type": "message_stop"}), ""


def _handler(server: WireServer) -> type[BaseHTTPRequestHandler]:
    validators = {s: _VALIDATORS[server.wire, s] for s in (False, True)}
    route = "/v1/chat/completions" if server.wire == "openai" else "/v1/messages"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            return

        def _send(
            self, status: int, body: bytes, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str, **headers: str) -> None:
            body: dict[str, Any]
            if server.wire == "openai":
                body = {"error": {"message": message, "type": "invalid_request_error"}}
            else:
                body = {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": message},
                }
            self._send(status, json.dumps(body).encode(), headers)

        def do_POST(self) -> None:
            if self.path.rstrip("/") != route:
                self._error(404, f"no route {self.path}")
                return
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                body = json.loads(raw)
                stream = isinstance(body, dict) and body.get("stream") is True
                _force(validators[stream].validate_python(body))
            except (ValueError, ValidationError) as e:
                with server.lock:
                    server.rejected.append(str(e))
                self._error(400, f"invalid request: {e}")
                return
            with server.lock:
                server.requests.append(body)
                fault = server.faults.pop(0) if server.faults else None
            server.gate.wait(60)
            if fault is not None:
                time.sleep(fault.delay)
                if fault.body is not None:
                    self._send(fault.status, fault.body, fault.headers)
                    return
                if fault.status != 200:
                    self._error(
                        fault.status, f"injected {fault.status}", **fault.headers
                    )
                    return
            if stream:
                self._stream(server.completion(body))
                return
            self._send(200, json.dumps(server.answer(body)).encode())

        def _stream(self, c: Completion) -> None:
            """Server-sent events, each piece of text ``piece_gap`` apart."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            events = (
                _openai_chunks(server, c)
                if server.wire == "openai"
                else _anthropic_events(server, c)
            )
            try:
                for value, piece in events:
                    assert value is not None
                    if piece and server.piece_gap:
                        time.sleep(server.piece_gap)
                    name = (
                        "" if server.wire == "openai" else f"event: {value['type']}\n"
                    )
                    self.wfile.write(f"{name}data: {json.dumps(value)}\n\n".encode())
                    self.wfile.flush()
                    if piece:
                        with server.lock:
                            server.sent.append((time.time(), piece))
                if server.wire == "openai":
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return  # the client went away (a worker killed mid-stream)

    return Handler


@contextmanager
def wire_server(
    wire: Wire, script: list[Completion], served_model: str = "served-model-1"
) -> Iterator[WireServer]:
    """Serve on 127.0.0.1; ``server.url`` is the SDK's ``base_url``."""
    state = WireServer(wire, list(script), served_model)
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    port = http.server_address[1]
    state.url = f"http://127.0.0.1:{port}" + ("/v1" if wire == "openai" else "")
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        http.shutdown()
        http.server_close()
