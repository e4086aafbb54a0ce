"""A real MCP server built with the ``mcp`` SDK, for the tests: a support desk's
tools. Every side effect is appended to the file ``ES_TEST_MCP_EFFECTS`` names
(one JSON line: tool, idempotency key, fencing token, arguments), so a test counts
effects across worker processes.

``python -m tests.mcp_servers stdio`` serves it on stdin/stdout;
``python -m tests.mcp_servers http PORT`` on ``http://127.0.0.1:PORT/mcp``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

KEY = "es-agents/idempotency_key"
FENCING = "es-agents/fencing_token"


def desk(extra_tool: bool = False) -> MCPServer:
    """The desk's server (``extra_tool``: one more tool, a changed list)."""
    app = MCPServer("desk")

    @app.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def lookup_order(order: int) -> dict[str, Any]:
        """Look an order up: its status."""
        return {"order": order, "status": "delivered"}

    @app.tool()
    def send_email(to: str, body: str, ctx: Context) -> dict[str, Any]:
        """Send an email."""
        key = _effect("send_email", ctx, {"to": to, "body": body})
        return {"sent": to, "key": key}

    @app.tool()
    def refund(order: int, ctx: Context) -> dict[str, Any]:
        """Refund an order."""
        key = _effect("refund", ctx, {"order": order})
        return {"refunded": order, "key": key}

    if extra_tool:

        @app.tool()
        def close_account(user: str) -> str:
            """Close a user's account."""
            return f"closed {user}"

    return app


def _effect(tool: str, ctx: Context, args: dict[str, Any]) -> str | None:
    meta = dict(ctx.request_context.meta or {})
    key = meta.get(KEY)
    line = {"tool": tool, "key": key, "fencing": meta.get(FENCING), "args": args}
    path = os.environ.get("ES_TEST_MCP_EFFECTS")
    if path:
        with Path(path).open("a") as out:
            out.write(json.dumps(line) + "\n")
    EFFECTS.append(line)
    return str(key) if key is not None else None


EFFECTS: list[dict[str, Any]] = []  # the in-process server's effects


if __name__ == "__main__":
    server = desk()
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
