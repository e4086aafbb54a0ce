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


def _validator(wire: Wire) -> TypeAdapter[Any]:
    if wire == "openai":
        from openai.types.chat.completion_create_params import (  # noqa: PLC0415
            CompletionCreateParamsNonStreaming,
        )

        return TypeAdapter(CompletionCreateParamsNonStreaming)
    from anthropic.types.message_create_params import (  # noqa: PLC0415
        MessageCreateParamsNonStreaming,
    )

    return TypeAdapter(MessageCreateParamsNonStreaming)


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

    def fail_next(self, *faults: Fault) -> None:
        with self.lock:
            self.faults.extend(faults)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn >= len(self.script):
            done = Completion(content="(no more turns)")
        else:
            done = self.script[turn]
        return (
            _openai(done, self.served_model)
            if self.wire == "openai"
            else (_anthropic(done, self.served_model))
        )


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


def _handler(server: WireServer) -> type[BaseHTTPRequestHandler]:
    validator = _validator(server.wire)
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
                _force(validator.validate_python(body))
            except (ValueError, ValidationError) as e:
                with server.lock:
                    server.rejected.append(str(e))
                self._error(400, f"invalid request: {e}")
                return
            with server.lock:
                server.requests.append(body)
                fault = server.faults.pop(0) if server.faults else None
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
            self._send(200, json.dumps(server.answer(body)).encode())

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
