"""The effects service: a local HTTP downstream that counts every effect per key.

``POST /charges`` (``Idempotency-Key`` header): charges once per key, like a payment
API; a repeated key returns the first charge and counts as a re-send, not an effect.
``GET /charges?key=K``: the lookup (200 with the charge, or 404).
``POST /emails`` (``{"to", "key"}``): sends one email per request, whatever the key;
the key is only recorded, so a second email for one key is a duplicate effect.
Both POSTs carry the caller's fencing token (``X-Fencing-Token: p<n>.e<epoch>``): a
token older than the newest seen for its partition is refused with 409, before any
effect (a worker that lost the partition and does not know it yet).

It runs inside the chaos harness (a thread), so no fault the harness injects stops it,
and its counts are the ground truth the checks compare with.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class EffectsService:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self.charges: dict[str, dict[str, Any]] = {}
        self.charge_requests: Counter[str] = Counter()
        self.emails: Counter[str] = Counter()
        self.epochs: dict[str, int] = {}
        self.fenced: Counter[str] = Counter()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="effects-service"
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> EffectsService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def effects(self) -> Counter[str]:
        """Effects per key: one per charge created, one per email sent."""
        with self._lock:
            counts = Counter(dict.fromkeys(self.charges, 1))
            counts.update(self.emails)
            return counts

    def admit(self, token: str | None, what: str) -> bool:
        """True unless ``token`` is older than the newest seen for its partition."""
        if not token:
            return True
        partition, _, epoch_text = token.partition(".e")
        try:
            epoch = int(epoch_text)
        except ValueError:
            return True
        with self._lock:
            if epoch < self.epochs.get(partition, 0):
                self.fenced[what] += 1
                return False
            self.epochs[partition] = epoch
            return True

    def charge(self, key: str, cents: int) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            self.charge_requests[key] += 1
            existing = self.charges.get(key)
            if existing is not None:
                return False, existing
            charge = {"id": f"ch_{len(self.charges) + 1}", "key": key, "cents": cents}
            self.charges[key] = charge
            return True, charge

    def email(self, key: str, to: str) -> int:
        with self._lock:
            self.emails[key] += 1
            return sum(self.emails.values())

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # A caller killed mid-call cannot read the answer; the effect counts.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length", "0"))
                value = json.loads(self.rfile.read(length) or b"{}")
                return value if isinstance(value, dict) else {}

            def do_POST(self) -> None:
                path = urlparse(self.path).path
                try:
                    body = self._body()
                except ValueError:
                    self._send(400, {"error": "body must be a JSON object"})
                    return
                if path in ("/charges", "/emails") and not service.admit(
                    self.headers.get("X-Fencing-Token"), path.strip("/")
                ):
                    self._send(409, {"error": "fenced: a newer owner has called"})
                    return
                if path == "/charges":
                    key = self.headers.get("Idempotency-Key")
                    if not key or not isinstance(body.get("cents"), int):
                        self._send(400, {"error": "Idempotency-Key and cents needed"})
                        return
                    created, charge = service.charge(key, body["cents"])
                    self._send(201 if created else 200, charge)
                elif path == "/emails":
                    key, to = body.get("key"), body.get("to")
                    if not isinstance(key, str) or not isinstance(to, str):
                        self._send(400, {"error": 'body must be {"to", "key"}'})
                        return
                    self._send(200, {"sent": to, "email": service.email(key, to)})
                else:
                    self._send(404, {"error": "not found"})

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/health":
                    self._send(200, {"ok": True})
                    return
                key = parse_qs(url.query).get("key", [""])[0]
                if url.path != "/charges" or not key:
                    self._send(404, {"error": "not found"})
                    return
                with service._lock:
                    charge = service.charges.get(key)
                if charge is None:
                    self._send(404, {"error": "no charge with that key"})
                else:
                    self._send(200, charge)

        return Handler
