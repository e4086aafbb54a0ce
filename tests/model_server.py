"""A local OpenAI-compatible chat-completions server for tests.

It speaks the wire format strictly (``POST /v1/chat/completions``, JSON body with
``model`` and ``messages``; the response shape of the OpenAI API) and answers by
what the user message asks for, so a test can poison one run among healthy ones:

- ``{"poison": "model_error"}``: HTTP 400 with an OpenAI error body, every time;
- ``{"poison": "unparsable"}``: HTTP 200 with ``{"choices": []}``;
- ``{"poison": "oversized"}``: a completion of 2 MB;
- ``{"poison": "tool_timeout"}``: a call to the tool ``hang`` (then "ok");
- anything else: the answer "ok".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _completion(model: str, message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *_: object) -> None:  # quiet
        return

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        length = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(length))
            model, messages = body["model"], body["messages"]
            assert isinstance(model, str)
            assert isinstance(messages, list)
        except (ValueError, KeyError, AssertionError):
            self._send(400, {"error": {"message": "invalid request body"}})
            return
        user: dict[str, Any] = next(
            (m for m in messages if m.get("role") == "user"), {}
        )
        try:
            ask = json.loads(user.get("content") or "{}")
        except ValueError:
            ask = {}
        poison = ask.get("poison") if isinstance(ask, dict) else None
        answered_tool = any(m.get("role") == "tool" for m in messages)
        if poison == "model_error":
            self._send(
                400,
                {
                    "error": {
                        "message": "This model's maximum context length is exceeded",
                        "type": "invalid_request_error",
                        "code": "context_length_exceeded",
                    }
                },
            )
        elif poison == "unparsable":
            self._send(200, {"id": "x", "object": "chat.completion", "choices": []})
        elif poison == "oversized":
            big = {"role": "assistant", "content": "x" * 2_000_000}
            self._send(200, _completion(model, big, "stop"))
        elif poison == "tool_timeout" and not answered_tool:
            call: dict[str, Any] = {
                "id": "call_1",
                "type": "function",
                "function": {"name": "hang", "arguments": "{}"},
            }
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [call],
            }
            self._send(200, _completion(model, message, "tool_calls"))
        else:
            ok = {"role": "assistant", "content": "ok"}
            self._send(200, _completion(model, ok, "stop"))


@contextmanager
def model_server(port: int = 0) -> Iterator[str]:
    """Serve on 127.0.0.1; yields the base URL (``http://127.0.0.1:PORT/v1``)."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
