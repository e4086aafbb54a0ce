"""Server-sent events of a run's streamed answers (``Client.stream``), for the web
UI and for applications: ``stream_app(client)`` is a Starlette app to mount in
your own ASGI service (its authentication in front of it), serving
``GET /runs/{run_id}/stream``.

Each delta is one event named after its kind (``start``, ``text``, ``end``) with a
JSON body ``{"step", "attempt", "text"}``; a ``done`` event with the run's status
closes the stream once the run stops working (it waits, or ended). A ``start``
with a higher attempt for the same step means the call was asked again after a
crash: what came before it is void.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from es_agents.async_client import astream
from es_agents.client import Client
from es_agents.errors import ConfigError, NotFound

STREAM_TIMEOUT = 3600.0  # one request follows a run for at most an hour


def sse(client: Client, run_id: str) -> Response:
    """The response that streams ``run_id``'s answers as server-sent events."""
    try:
        client.status(run_id)
    except NotFound as e:
        return Response(str(e), status_code=404, media_type="text/plain")
    if client.ports.deltas is None:
        why = ConfigError(f"the {client.ports.store} store does not stream")
        return Response(str(why), status_code=501, media_type="text/plain")
    return StreamingResponse(
        _events(client, run_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(client: Client, run_id: str) -> AsyncIterator[str]:
    yield ": following\n\n"  # the headers go out now
    async for delta in astream(client, run_id, STREAM_TIMEOUT):
        body = {"step": delta.step, "attempt": delta.attempt, "text": delta.text}
        yield f"event: {delta.kind}\ndata: {json.dumps(body)}\n\n"
    try:
        status = client.status(run_id).status
    except NotFound:
        status = "unknown"
    yield f"event: done\ndata: {json.dumps({'status': status})}\n\n"


def stream_app(client: Client) -> Starlette:
    """``GET /runs/{run_id}/stream``: the run's answers as server-sent events."""

    async def stream(request: Request) -> Response:
        return sse(client, request.path_params["run_id"])

    return Starlette(routes=[Route("/runs/{run_id}/stream", stream)])
