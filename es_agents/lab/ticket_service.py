"""A small real ticketing HTTP service: tickets in Postgres, idempotent by key.

POST /tickets {"title": ...} with an ``Idempotency-Key`` header creates a ticket, or
returns the one already created with that key (never a second one).
GET /tickets?idempotency_key=K answers a lookup (200 with the ticket, or 404).
GET /tickets/stats?prefix=P counts tickets and keys whose key starts with P.

Run: python -m es_agents.lab.ticket_service --port 18080 --database-url postgresql://...
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import psycopg
from psycopg_pool import ConnectionPool

SCHEMA = """
CREATE TABLE IF NOT EXISTS demo_tickets (
    id              bigserial PRIMARY KEY,
    idempotency_key text UNIQUE NOT NULL,
    title           text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
)
"""


def make_handler(pool: ConnectionPool[Any]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if urlparse(self.path).path != "/tickets":
                self._send(404, {"error": "not found"})
                return
            key = self.headers.get("Idempotency-Key")
            if not key:
                self._send(400, {"error": "Idempotency-Key header required"})
                return
            length = int(self.headers.get("Content-Length", "0"))
            try:
                title = str(json.loads(self.rfile.read(length))["title"])
            except (ValueError, KeyError, TypeError):
                self._send(400, {"error": 'body must be {"title": ...}'})
                return
            with pool.connection() as conn:
                row = conn.execute(
                    "INSERT INTO demo_tickets (idempotency_key, title) VALUES (%s, %s) "
                    "ON CONFLICT (idempotency_key) DO NOTHING "
                    "RETURNING id, idempotency_key, title, created_at",
                    (key, title),
                ).fetchone()
                created = row is not None
                if row is None:
                    row = conn.execute(
                        "SELECT id, idempotency_key, title, created_at "
                        "FROM demo_tickets "
                        "WHERE idempotency_key = %s",
                        (key,),
                    ).fetchone()
            if row is None:
                self._send(409, {"error": "ticket vanished"})
                return
            self._send(201 if created else 200, _ticket(row))

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if url.path == "/health":
                self._send(200, {"ok": True})
            elif url.path == "/tickets" and "idempotency_key" in query:
                with pool.connection() as conn:
                    row = conn.execute(
                        "SELECT id, idempotency_key, title, created_at "
                        "FROM demo_tickets "
                        "WHERE idempotency_key = %s",
                        (query["idempotency_key"][0],),
                    ).fetchone()
                if row is None:
                    self._send(404, {"error": "no ticket with that key"})
                else:
                    self._send(200, _ticket(row))
            elif url.path == "/tickets/stats":
                prefix = query.get("prefix", [""])[0]
                with pool.connection() as conn:
                    count, keys = conn.execute(
                        "SELECT count(*), count(DISTINCT idempotency_key) "
                        "FROM demo_tickets WHERE idempotency_key LIKE %s",
                        (prefix.replace("%", r"\%") + "%",),
                    ).fetchone() or (0, 0)
                self._send(200, {"tickets": count, "keys": keys})
            else:
                self._send(404, {"error": "not found"})

    return Handler


def _ticket(row: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "id": row[0],
        "idempotency_key": row[1],
        "title": row[2],
        "created_at": row[3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in a container")
    parser.add_argument("--database-url", required=True)
    args = parser.parse_args()
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    pool: ConnectionPool[Any] = ConnectionPool(
        args.database_url, min_size=1, max_size=8, kwargs={"autocommit": True}
    )
    server = ThreadingHTTPServer((args.host, args.port), make_handler(pool))
    print(f"ticket service on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
