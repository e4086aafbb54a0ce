"""A small OpenAI-compatible chat completions server for ``bench stream``: every
answer is ``pieces`` pieces of text, ``gap`` seconds apart, streamed as server-sent
events when the request asks for a stream (one JSON body otherwise, after as
long). It runs in a process of its own, so the bench's CPU figures are the
worker's; each piece's text is unique (``p<answer>.<n>``) and the time it was
written is logged to ``--sent FILE`` (JSON lines), so a follower can tell how late
each piece came."""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


def serve(port: int, pieces: int, gap: float, sent: Path) -> None:
    answers = itertools.count()
    log_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            return

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = next(answers)
            texts = [f"p{n}.{i} " for i in range(pieces)]
            if not body.get("stream"):
                # As long as the streamed answer takes: the same wall time, so the
                # worker's background CPU weighs the same in every variant.
                time.sleep(gap * pieces)
                answer = {
                    "id": "chatcmpl-bench", "object": "chat.completion",
                    "created": int(time.time()), "model": "bench-model",
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant", "content": "".join(texts)}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": pieces,
                              "total_tokens": 10 + pieces},
                }  # fmt: skip
                raw = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(_chunk({"role": "assistant", "content": ""}))
            times = []
            for text in texts:
                if gap:
                    time.sleep(gap)
                self.wfile.write(_chunk({"content": text}))
                self.wfile.flush()
                times.append({"text": text, "at": time.time()})
            self.wfile.write(_chunk({}, "stop"))
            usage = {"prompt_tokens": 10, "completion_tokens": pieces,
                     "total_tokens": 10 + pieces}  # fmt: skip
            last = json.loads(_chunk({})[6:])
            last["choices"], last["usage"] = [], usage
            self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            with log_lock, sent.open("a") as out:
                out.writelines(json.dumps(t) + "\n" for t in times)

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # a worker's calls at once, and more
        daemon_threads = True

    Server(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pieces", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--sent", type=Path, required=True)
    args = parser.parse_args()
    serve(args.port, args.pieces, args.gap, args.sent)


if __name__ == "__main__":
    main()
