"""``es-agents ui``: a small web app over the client and the projections.

Starlette with Jinja2 templates and htmx served from the package (no JavaScript
build step): the runs with filters and live status, a run's page with its timeline
and the pending approval's arguments and approve / reject buttons, the dead letters,
and the cost per run and per agent. Decisions go through ``Client`` -- the same
checks as the CLI -- with the approver's identity from a configured header (set by
an authenticating proxy) or, without one, the name typed in the form.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from es_agents.client import Client
from es_agents.errors import EsAgentsError, NotFound
from es_agents.replay import timeline
from es_agents.settings import ModelPrice

HERE = Path(__file__).parent
STATUSES = ("running", "paused", "blocked", "completed", "failed", "cancelled")


def make_app(client: Client, user_header: str | None = None) -> Starlette:
    """The app over ``client``. ``user_header``: the request header that names the
    approver (an authenticating proxy sets it); without it, the form's name."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    prices = client.settings.prices

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def runs_page(request: Request) -> Response:
        return templates.TemplateResponse(
            request, "runs.html", {"statuses": STATUSES, **await _runs(request)}
        )

    async def runs_table(request: Request) -> Response:
        return templates.TemplateResponse(
            request, "_runs_table.html", await _runs(request)
        )

    async def _runs(request: Request) -> dict[str, Any]:
        status = request.query_params.get("status") or None
        agent = request.query_params.get("agent") or None
        rows = await call(client.runs, status, 200, agent=agent)
        return {"rows": rows, "status": status or "", "agent": agent or ""}

    async def run_page(request: Request) -> Response:
        return templates.TemplateResponse(
            request, "run.html", await _run(request.path_params["run_id"])
        )

    async def run_body(request: Request) -> Response:
        return templates.TemplateResponse(
            request, "_run_body.html", await _run(request.path_params["run_id"])
        )

    async def _run(run_id: str) -> dict[str, Any]:
        try:
            view = await call(client.status, run_id)
            events = await call(client.events, run_id)
        except NotFound:
            return {"run_id": run_id, "missing": True}
        entries = timeline(events, prices)
        return {
            "run_id": run_id,
            "missing": False,
            "view": view,
            "entries": entries,
            "awaiting": _awaiting(view),
            "cost": round(sum(float(str(e.get("cost_usd") or 0)) for e in entries), 6),
            "user_header": user_header,
        }

    async def decide(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        form = await request.form()
        by = request.headers.get(user_header) if user_header else form.get("by")
        if not by or not isinstance(by, str):
            who = f"the {user_header} header" if user_header else "a name"
            return HTMLResponse(f'<p class="refused">refused: {who} is needed</p>', 401)
        action = request.path_params["action"]
        method = client.approve if action == "approve" else client.reject
        try:
            result = await call(method, run_id, by, None, None, 10.0)
        except EsAgentsError as e:
            return HTMLResponse(f'<p class="refused">{type(e).__name__}: {e}</p>', 409)
        return templates.TemplateResponse(
            request, "_verdict.html", {"result": result, "by": by}
        )

    async def dlq_page(request: Request) -> Response:
        letters = await call(client.dead_letters, None, 200)
        return templates.TemplateResponse(
            request, "dlq.html", {"letters": [asdict(d) for d in letters]}
        )

    async def costs_page(request: Request) -> Response:
        rows = await call(client.runs, None, 1000)
        return templates.TemplateResponse(request, "costs.html", _costs(rows, prices))

    return Starlette(
        routes=[
            Route("/", runs_page),
            Route("/runs/table", runs_table),
            Route("/runs/{run_id}", run_page),
            Route("/runs/{run_id}/body", run_body),
            Route("/runs/{run_id}/{action:str}", decide, methods=["POST"]),
            Route("/dlq", dlq_page),
            Route("/costs", costs_page),
            Mount(
                "/static", StaticFiles(directory=str(HERE / "static")), name="static"
            ),
        ]
    )


def _awaiting(view: Any) -> dict[str, Any] | None:
    import contextlib  # noqa: PLC0415
    import json  # noqa: PLC0415

    state = view.state
    if state is None or state.status != "paused" or state.waiting is None:
        return None
    try:
        detail = json.loads(state.waiting.detail_json or "{}")
    except ValueError:
        detail = {}
    args: Any = detail.get("args_json") if isinstance(detail, dict) else None
    if isinstance(args, str):
        with contextlib.suppress(ValueError):  # else shown as recorded
            args = json.dumps(json.loads(args), indent=2)
    return {
        "reason": state.waiting.reason,
        "gate": state.waiting.gate,
        "tool": detail.get("tool") if isinstance(detail, dict) else None,
        "args": args,
    }


def _costs(
    rows: list[dict[str, object]], prices: dict[str, ModelPrice]
) -> dict[str, Any]:
    """Cost per run and per agent from the runs table's token counts, priced by
    ``ES_AGENTS_PRICES`` for each run's model."""
    per_run = []
    per_agent: dict[str, dict[str, float]] = {}
    for row in rows:
        model = str(row.get("model_id") or "")
        prompt = int(str(row.get("prompt_tokens") or 0))
        completion = int(str(row.get("completion_tokens") or 0))
        price = prices.get(model)
        cost = price.cost(prompt, completion) if price is not None else None
        per_run.append({**row, "cost_usd": cost})
        agent = per_agent.setdefault(
            str(row.get("agent")), {"runs": 0, "tokens": 0, "cost_usd": 0.0}
        )
        agent["runs"] += 1
        agent["tokens"] += prompt + completion
        agent["cost_usd"] += cost or 0.0
    return {"runs": per_run, "agents": per_agent, "priced": bool(prices)}
