"""``es-agents ui``: a small web app over the client and the projections.

Starlette with Jinja2 templates (autoescaped) and htmx served from the package (no
JavaScript build step): the runs with filters and live status; a run's page with
its input, its conversation, its timeline and the pending approval's arguments with
approve / reject buttons; the dead letters; the cost per run and per agent.
Decisions go through ``Client`` -- the same checks as the CLI -- in the name of the
signed-in person (``auth``), never a name typed in a form.

The run page refreshes its timeline every second; the approval box is refreshed
only when what waits changes (the server answers 204 otherwise), so a decision made
after any time on the page goes through and its verdict stays on the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

from markupsafe import escape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from es_agents.client import Client, RunView
from es_agents.core.approvals import pause_of
from es_agents.errors import EsAgentsError, NotFound
from es_agents.replay import timeline
from es_agents.run_tree import child_runs
from es_agents.settings import ModelPrice
from es_agents.ui.auth import SignIn, cross_site, csrf_token
from es_agents.ui.conversation import conversation
from es_agents.ui.signing import signed_decision, signing
from es_agents.ui.stream import sse

HERE = Path(__file__).parent
STATUSES = ("running", "paused", "blocked", "completed", "failed", "cancelled")
OPEN_PATHS = ("/login", "/static/")


def make_app(
    client: Client,
    sign_in: SignIn | None = None,
    *,
    secret: str | None = None,
    https: bool = False,
) -> Starlette:
    """The app over ``client``; ``sign_in`` says how people are known (by default a
    token, ``sign_in.token``); ``secret`` signs the session cookies (random: the
    sessions end with the process)."""
    pages = _Pages(client, sign_in or SignIn())
    return Starlette(
        routes=[
            Route("/login", pages.login_page),
            Route("/login", pages.login, methods=["POST"]),
            Route("/logout", pages.logout, methods=["POST"]),
            Route("/", pages.runs_page),
            Route("/runs/table", pages.runs_table),
            Route("/runs/{run_id}", pages.run_page),
            Route("/runs/{run_id}/body", pages.run_body),
            Route("/runs/{run_id}/approval", pages.approval_box),
            Route("/runs/{run_id}/stream", pages.stream),
            Route("/runs/{run_id}/{action:str}", pages.decide, methods=["POST"]),
            Route("/dlq", pages.dlq_page),
            Route("/costs", pages.costs_page),
            Mount(
                "/static", StaticFiles(directory=str(HERE / "static")), name="static"
            ),
        ],
        middleware=[  # outermost first: the session, then who is signed in
            Middleware(
                SessionMiddleware,
                secret_key=secret or secrets.token_urlsafe(32),
                session_cookie="es_agents_ui",
                same_site="lax",
                https_only=https,
            ),
            Middleware(BaseHTTPMiddleware, dispatch=pages.signed_in_only),
        ],
    )


class _Pages:
    """The app's handlers, over one client and one way of signing in."""

    def __init__(self, client: Client, doors: SignIn) -> None:
        self.client = client
        self.doors = doors
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.prices = client.settings.prices

    def page(self, request: Request, name: str, context: dict[str, Any]) -> Response:
        who = self.doors.identity(request)
        awaiting = context.get("awaiting") or {}
        extra = {
            "csrf": csrf_token(request),
            "who": who,
            "mode": self.doors.mode,
            "signing": signing(awaiting.get("pause"), who),
        }
        return self.templates.TemplateResponse(request, name, {**context, **extra})

    async def signed_in_only(self, request: Request, call_next: Any) -> Response:
        path = request.url.path
        if any(path.startswith(p) for p in OPEN_PATHS):
            response: Response = await call_next(request)
        elif self.doors.identity(request) is None:
            if request.method != "GET" or "hx-request" in request.headers:
                return _refused("sign in first", 401)
            return RedirectResponse(f"/login?next={quote(path)}", 303)
        else:
            response = await call_next(request)
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response

    async def login_page(self, request: Request) -> Response:
        target = _local(request.query_params.get("next", "/"))
        if self.doors.identity(request):
            return RedirectResponse(target, 303)
        token = request.query_params.get("token")
        printed = token is not None and self.doors.mode == "token"
        if printed and self.doors.sign_in(request, {"token": token or ""}) is None:
            return RedirectResponse(target, 303)
        return self.page(request, "login.html", {"next": target, "refused": None})

    async def login(self, request: Request) -> Response:
        form = {k: str(v) for k, v in (await request.form()).items()}
        target = _local(form.get("next", "/"))
        if (why := cross_site(request, form.get("csrf"))) is not None:
            return _refused(why, 403)
        refused = self.doors.sign_in(request, form)
        if refused is None:
            return RedirectResponse(target, 303)
        response = self.page(
            request, "login.html", {"next": target, "refused": refused}
        )
        response.status_code = 401
        return response

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if (why := cross_site(request, _str(form.get("csrf")))) is not None:
            return _refused(why, 403)
        request.session.clear()
        return RedirectResponse("/login", 303)

    async def runs_page(self, request: Request) -> Response:
        context = {"statuses": STATUSES, **await self._runs(request)}
        return self.page(request, "runs.html", context)

    async def runs_table(self, request: Request) -> Response:
        return self.page(request, "_runs_table.html", await self._runs(request))

    async def _runs(self, request: Request) -> dict[str, Any]:
        status = request.query_params.get("status") or None
        agent = request.query_params.get("agent") or None
        found = await _call(self.client.runs, status, 200, agent=agent)
        rows = [asdict(r) for r in found]
        return {"rows": rows, "status": status or "", "agent": agent or ""}

    async def run_page(self, request: Request) -> Response:
        context = await self._run(request.path_params["run_id"])
        return self.page(request, "run.html", context)

    async def run_body(self, request: Request) -> Response:
        context = await self._run(request.path_params["run_id"])
        return self.page(request, "_run_body.html", context)

    async def approval_box(self, request: Request) -> Response:
        # Polled every second: the run's status only (not its events), enough to
        # tell whether what waits changed.
        run_id = request.path_params["run_id"]
        try:
            view = await _call(self.client.status, run_id)
        except NotFound:
            context: dict[str, Any] = {"run_id": run_id, "approval_key": "missing"}
        else:
            awaiting = _awaiting(view)
            key = _approval_key(view, awaiting)
            context = {"run_id": run_id, "awaiting": awaiting, "approval_key": key}
        if request.query_params.get("seen") == context["approval_key"]:
            return Response(status_code=204)  # unchanged: the form stays as it is
        return self.page(request, "_approval.html", context)

    async def stream(self, request: Request) -> Response:
        """The run's answers as they stream (server-sent events, ``ui.stream``)."""
        run_id = request.path_params["run_id"]
        response: Response = await _call(sse, self.client, run_id)
        return response

    async def _run(self, run_id: str) -> dict[str, Any]:
        try:
            view = await _call(self.client.status, run_id)
            events = await _call(self.client.events, run_id)
        except NotFound:
            return {"run_id": run_id, "missing": True, "approval_key": "missing"}
        entries = timeline(events, self.prices)
        awaiting = _awaiting(view)
        children = await _call(self._children, events)
        return {
            "children": children,
            "run_id": run_id,
            "missing": False,
            "view": view,
            "entries": entries,
            "conversation": conversation(events),
            "awaiting": awaiting,
            "approval_key": _approval_key(view, awaiting),
            "cost": round(sum(float(str(e.get("cost_usd") or 0)) for e in entries), 6),
        }

    def _children(self, events: list[Any]) -> list[tuple[str, str]]:
        """The child runs a run started (sub-agents), with their status."""
        out = []
        for child in child_runs(events):
            try:
                out.append((child, self.client.status(child).status))
            except NotFound:
                out.append((child, "pending"))
        return out

    async def decide(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        action = request.path_params["action"]
        if action not in ("approve", "reject", "message", "end", "input"):
            return _refused(f"no such action: {action}", 404)
        form = await request.form()
        if (why := cross_site(request, _str(form.get("csrf")))) is not None:
            return _refused(why, 403)
        by = self.doors.identity(request)
        if by is None:
            return _refused("sign in first", 401)
        try:
            if action == "input":  # JSON as typed, else the text as a string
                result = await _call(
                    self.client.provide_input, run_id, by, _as_value(form.get("text"))
                )
            elif action in ("message", "end"):
                text = _str(form.get("text")) or ""
                result = await _call(
                    self.client.send_message,
                    run_id,
                    text,
                    by,
                    10.0,
                    end=action == "end",
                )
            elif (signed := signed_decision(action, run_id, by, form)) is not None:
                if isinstance(signed, str):
                    return _refused(signed, 400)
                result = await _call(self.client.send, signed, 10.0)
            else:
                method = (
                    self.client.approve if action == "approve" else self.client.reject
                )
                # A rejection's reason (the model reads it when the tool says so);
                # with an approval, its comment.
                reason = _str(form.get("reason")) or None
                edited = _edited(form.get("args"), form.get("original"))
                if action == "approve" and edited is not None:
                    result = await _call(
                        self.client.approve, run_id, by, None, reason, 10.0,
                        args=edited,
                    )  # fmt: skip
                else:
                    result = await _call(method, run_id, by, None, reason, 10.0)
        except EsAgentsError as e:
            return _refused(f"{type(e).__name__}: {e}", 409)
        return self.page(request, "_verdict.html", {"result": result, "by": by})

    async def dlq_page(self, request: Request) -> Response:
        letters = await _call(self.client.dead_letters, None, 200)
        context = {"letters": [asdict(d) for d in letters]}
        return self.page(request, "dlq.html", context)

    async def costs_page(self, request: Request) -> Response:
        found = await _call(self.client.runs, None, 1000)
        rows = [asdict(r) for r in found]
        return self.page(request, "costs.html", _costs(rows, self.prices))


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def _refused(why: str, status: int) -> HTMLResponse:
    return HTMLResponse(f'<p class="refused">refused: {escape(why)}</p>', status)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _local(target: str) -> str:
    """A redirect target on this site only (no open redirect)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _approval_key(view: RunView, awaiting: dict[str, Any] | None) -> str:
    state = view.state
    step = state.step if state is not None else -1
    reason = awaiting["reason"] if awaiting else ""
    since = state.waiting.since_seq if state is not None and state.waiting else -1
    return f"{view.status}:{step}:{reason}:{since}"


def _awaiting(view: RunView) -> dict[str, Any] | None:
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
    found = detail if isinstance(detail, dict) else {}
    return {
        "reason": state.waiting.reason,
        "gate": state.waiting.gate,
        "tool": found.get("tool"),
        "args": args,
        "question": found.get("question"),  # ask_human's
        "invalid": found.get("invalid"),
        "why": found.get("why"),  # a budget's limit reached
        "pause": pause_of(state),  # at a gate: what a signed decision covers
    }


def _edited(args: object, original: object) -> str | None:
    """The arguments a person changed in the page (None: left as they were)."""
    if not isinstance(args, str) or not isinstance(original, str):
        return None
    try:
        if json.loads(args) == json.loads(original):
            return None
    except ValueError:
        return args  # not JSON: the approval is refused, saying so
    return args


def _as_value(text: object) -> object:
    """An answer typed in the page: JSON when it parses, else the text itself."""
    raw = str(text or "")
    try:
        return json.loads(raw)
    except ValueError:
        return raw


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
