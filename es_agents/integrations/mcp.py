"""Tools served by an MCP server, as es-agents tools (the ``mcp`` SDK).

``MCPTools(server)`` lists the server's tools once (when ``tools()`` is first
asked) and makes each an es-agents ``Tool``: the model sees the server's name,
description and input schema; a call is written ahead like any tool call, checked
against the schema, and sent with its idempotency key and fencing token in the
request's ``_meta``. The schemas are part of the agent's tool hash, which
``run_started`` records and the version gate holds: a run started under one list
of tools is not continued under another (``VersionPolicy.tools_hash``).

``server`` is what ``mcp.Client`` takes: a URL (streamable HTTP), a
``StdioServerParameters`` (a command started as a subprocess), or an in-process
``MCPServer``. One session per server is held by each event loop that calls it
and opened again when it broke.

What the server says of a tool decides what the runtime does at a crash: a tool
annotated read-only (``readOnlyHint``) has no side effect and is called again; a
server that dedupes by ``es-agents/idempotency_key`` (``honors_idempotency_key``)
is called again with the same key; any other call is guarded by the dedupe table,
and a call whose answer was lost pauses the run (``uncertain_effect``) for a person.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, cast

import anyio
import jsonschema
import mcp_types
from mcp import Client, MCPError
from pydantic import JsonValue

from es_agents.core.approvals import ApprovalPolicy
from es_agents.errors import (
    ConfigError,
    EffectUnknown,
    RetryableToolError,
    TerminalToolError,
)
from es_agents.integrations.common import run_to_end
from es_agents.tools import Arguments, SchemaTool, Tool, ToolContext

KEY = "es-agents/idempotency_key"
FENCING = "es-agents/fencing_token"
RUN = "es-agents/run_id"

Server = Any  # what mcp.Client takes: a URL, StdioServerParameters, an MCPServer


@dataclass(frozen=True)
class MCPTool(SchemaTool):
    """One tool of an MCP server; its schema is the server's."""

    server_name: str = ""

    def parse(self, args: dict[str, JsonValue]) -> Arguments:
        problems = sorted(
            jsonschema.validators.validator_for(self.parameters)(
                self.parameters
            ).iter_errors(args),
            key=lambda e: list(e.absolute_path),
        )
        if problems:
            said = "; ".join(_problem(p) for p in problems)
            raise TerminalToolError(f"{self.name}: invalid arguments: {said}")
        return Arguments.model_validate(args)


def _problem(error: jsonschema.ValidationError) -> str:
    """One argument's problem, said without its value (it may be secret)."""
    where = ".".join(map(str, error.absolute_path))
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [str(r) for r in error.validator_value if r not in error.instance]
        return "; ".join(
            f"{where + '.' if where else ''}{m}: required" for m in missing
        )
    if error.validator == "type":
        return f"{where or 'arguments'}: should be {error.validator_value}"
    return f"{where or 'arguments'}: does not fit ({error.validator})"


class MCPTools:
    """The tools of one MCP server (see the module's docstring).

    ``gated`` names the tools that wait for an approval (``approval`` gives a
    tool's deciders, and gates it too); ``read_only`` overrides the server's
    ``readOnlyHint`` for the tools it names; ``include`` keeps only those tools;
    ``prefix`` is put before every tool's name (two servers with a tool of the
    same name)."""

    def __init__(
        self,
        server: Server,
        *,
        name: str = "mcp",
        prefix: str = "",
        include: Collection[str] | None = None,
        gated: Collection[str] = (),
        approval: Mapping[str, ApprovalPolicy] | None = None,
        on_reject: Literal["end", "tell_model"] = "end",
        decide_within: timedelta | None = None,
        read_only: Collection[str] | None = None,
        honors_idempotency_key: bool = False,
        timeout: float | None = 120.0,
    ) -> None:
        self.server = server
        self.name = name
        self.prefix = prefix
        self.include = None if include is None else frozenset(include)
        self.gated = frozenset(gated) | frozenset(approval or {})
        self.approval = dict(approval or {})
        self.on_reject = on_reject
        self.decide_within = decide_within
        self.read_only = None if read_only is None else frozenset(read_only)
        self.honors_idempotency_key = honors_idempotency_key
        self.timeout = timeout
        self._tools: list[MCPTool] | None = None
        self._sessions: dict[asyncio.AbstractEventLoop, _Session] = {}
        self._lock = threading.Lock()

    def tools(self) -> list[Tool[Any]]:
        """The server's tools, listed on first use (then the same list)."""
        with self._lock:
            if self._tools is None:
                self._tools = self._made(_listed(self.server, self.name))
            return list[Tool[Any]](self._tools)

    def _made(self, listed: list[mcp_types.Tool]) -> list[MCPTool]:
        names = {t.name for t in listed}
        for wanted, what in (
            (self.gated, "gated"),
            (self.include or frozenset(), "included"),
            (self.read_only or frozenset(), "read-only"),
        ):
            missing = sorted(wanted - names)
            if missing:
                raise ConfigError(
                    f"MCP server {self.name!r} has no tool {', '.join(missing)} "
                    f"(named {what}); it has: {', '.join(sorted(names))}"
                )
        return [
            self._tool(t)
            for t in listed
            if self.include is None or t.name in self.include
        ]

    def _tool(self, listed: mcp_types.Tool) -> MCPTool:
        remote = listed.name
        if self.read_only is not None:
            read_only = remote in self.read_only
        else:
            hints = listed.annotations
            read_only = bool(hints is not None and hints.read_only_hint)

        async def call(args: Arguments, ctx: ToolContext) -> JsonValue:
            return await self._call(remote, args.model_dump(), ctx, read_only)

        return MCPTool(
            name=self.prefix + remote,
            fn=call,
            args_model=Arguments,
            description=listed.description or "",
            side_effect=not read_only,
            honors_idempotency_key=self.honors_idempotency_key,
            requires_approval=remote in self.gated,
            approval=self.approval.get(remote),
            timeout=self.timeout,
            on_reject=self.on_reject,
            decide_within=self.decide_within if remote in self.gated else None,
            parameters=dict(listed.input_schema),
            server_name=self.name,
        )

    async def _call(
        self, remote: str, args: dict[str, Any], ctx: ToolContext, read_only: bool
    ) -> JsonValue:
        session = self._session()
        try:
            client = await session.client()
        except Exception as e:  # nothing was sent: any failure may pass
            raise RetryableToolError(f"MCP server {self.name!r}: {e}") from e
        meta = cast(
            mcp_types.RequestParamsMeta,
            {KEY: ctx.idempotency_key, FENCING: ctx.fencing_token, RUN: ctx.run_id},
        )
        try:
            result = await client.call_tool(remote, args, meta=meta)
        except MCPError as e:
            if e.code not in _LOST:  # the server answered: an error
                raise TerminalToolError(f"{remote}: {e.message}") from e
            lost: Exception = e
        except (OSError, RuntimeError, anyio.BrokenResourceError) as e:
            lost = e
        else:
            value = _value(result)
            if result.is_error:
                raise TerminalToolError(f"{remote}: {value}")
            return value
        session.broken()
        why = f"MCP server {self.name!r}: the answer to {remote} was lost: {lost}"
        if read_only or self.honors_idempotency_key:
            raise RetryableToolError(why) from lost
        raise EffectUnknown(why) from lost

    def _session(self) -> _Session:
        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [k for k in self._sessions if k.is_closed()]:
                del self._sessions[old]
            session = self._sessions.get(loop)
            if session is None:
                session = self._sessions[loop] = _Session(self.server)
            return session

    async def aclose(self) -> None:
        """Close this event loop's session (a worker closes at its end anyway)."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()


# Errors that say the connection, not the server, ended the call.
_LOST = frozenset({mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT})


class _Session:
    """One MCP session, held open by a task of the event loop that uses it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._client: Client | None = None
        self._ready: asyncio.Future[Client] | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def client(self) -> Client:
        if self._ready is None or (self._ready.done() and self._ready.exception()):
            self._ready = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._hold(self._ready, self._stop))
        return await asyncio.shield(self._ready)

    async def _hold(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        try:
            async with Client(self.server) as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(
                    e if isinstance(e, Exception) else RuntimeError(repr(e))
                )
            if not isinstance(e, Exception):
                raise

    def broken(self) -> None:
        """Open a new session for the next call."""
        self._stop.set()
        self._ready = None

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def _value(result: mcp_types.CallToolResult) -> JsonValue:
    """What a call returned, as JSON: its structured content when it has one,
    else its text (one block: the text; several: a list), other blocks named."""
    if result.structured_content is not None:
        return cast(JsonValue, result.structured_content)
    parts: list[JsonValue] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:
            parts.append({"type": block.type, "omitted": True})
    if len(parts) == 1:
        return parts[0]
    return parts


def _listed(server: Server, name: str) -> list[mcp_types.Tool]:
    """The server's tools (all pages), asked on a short session of its own -- on
    a thread when this thread already runs an event loop."""

    async def ask() -> list[mcp_types.Tool]:
        listed: list[mcp_types.Tool] = []
        async with Client(server) as client:
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return listed

    try:
        return run_to_end(ask(), "mcp-list")
    except Exception as e:
        raise ConfigError(
            f"MCP server {name!r} did not list its tools: {type(e).__name__}: {e}"
        ) from e
