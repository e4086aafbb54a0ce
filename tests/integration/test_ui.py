"""`es-agents ui` in a real browser (Playwright driving Debian's chromium, started
by the test): sign in, open a paused run, read the arguments being approved, stay
on the page a while (it refreshes every second), approve it and watch it complete.
Also what the page refuses: a decision without signing in, a cross-site POST, a
POST without the CSRF token, markup in a run id (escaped). And the runs list, the
dead letters and costs. ``ES_AGENTS_UI_SCREENSHOTS=DIR`` saves the pages'
screenshots there (docs/)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import expect, sync_playwright

from es_agents.lab.demo import _env, cli
from tests.integration.test_commands import until, worker
from tests.test_support import ROOT, free_port

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - http://127.0.0.1
            return True
    except OSError:
        return False


def _users(env: dict[str, str], path: Path) -> Path:
    """A users file with ann in it, written by the CLI."""
    added = subprocess.run(
        [sys.executable, "-m", "es_agents.cli", "ui", "adduser", "ann", "--users",
         str(path), "--password-stdin"],
        input="correct horse\n", cwd=ROOT, env=_env(**env), capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "correct horse" not in path.read_text()  # a hash, not the password
    return path


def _sign_in(page: Any, base: str) -> None:
    page.goto(base + "/")
    expect(page.locator("h1")).to_have_text("Sign in")  # redirected
    page.fill("#name", "ann")
    page.fill("#password", "wrong horse")
    page.click("#sign-in")
    expect(page.locator("#refused")).to_contain_text("wrong password")
    page.fill("#name", "ann")
    page.fill("#password", "correct horse")
    page.click("#sign-in")
    expect(page.locator("#who")).to_have_text("ann")


def _other_pages(page: Any, base: str) -> None:
    page.goto(base + "/costs")
    expect(page.locator("body")).to_contain_text("research")
    page.goto(base + "/dlq")
    expect(page.locator("h1")).to_have_text("Dead letters")


def _refusals(p: Any, page: Any, base: str, run: str) -> None:
    """What the UI refuses, each answered by the server (nothing is decided)."""
    csrf = page.locator("#approval input[name=csrf]").get_attribute("value")
    assert csrf
    outsider = p.request.new_context()  # no session cookie: not signed in
    answer = outsider.post(f"{base}/runs/{run}/approve", form={"csrf": csrf})
    assert answer.status == 401, answer.text()
    assert "sign in first" in answer.text()
    outsider.dispose()
    signed_in = page.request  # the browser's cookies
    forged = signed_in.post(
        f"{base}/runs/{run}/approve",
        form={"csrf": csrf},
        headers={"Origin": "https://evil.example"},
    )  # a form on another site, posted with the cookie
    assert forged.status == 403, forged.text()
    assert "cross-site" in forged.text()
    tokenless = signed_in.post(f"{base}/runs/{run}/approve", form={"by": "mallory"})
    assert tokenless.status == 403, tokenless.text()
    assert "CSRF" in tokenless.text()
    markup = "<img src=x onerror=alert(1)>"
    xss = signed_in.post(f"{base}/runs/{quote(markup)}/approve", form={"csrf": csrf})
    assert xss.status == 409, xss.text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in xss.text()
    assert markup not in xss.text()
    expect(page.locator("#status")).to_have_text("paused")  # nothing was decided


def test_approve_a_paused_run_in_the_browser(  # noqa: PLR0915 - one page visit
    env: dict[str, str], tmp_path: Path
) -> None:
    assert Path(CHROMIUM).exists(), "Debian's chromium: apt-get install chromium"
    shots = Path(os.environ.get("ES_AGENTS_UI_SCREENSHOTS", tmp_path))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = f"ui-{uuid.uuid4().hex[:8]}"
    users = _users(env, tmp_path / "users")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "ui",
            "--port",
            str(port),
            "--users",
            str(users),
        ],
        cwd=ROOT,
        env=_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with worker(env, "tests.agents:gated"), sync_playwright() as p:
            projector = subprocess.Popen(
                [sys.executable, "-m", "es_agents.cli", "projector"],
                cwd=ROOT,
                env=_env(**env),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                started = cli(
                    env, "start", "research", "--run-id", run, "--input",
                    '{"topic": "a browser"}',
                )  # fmt: skip
                assert started.returncode == 0, started.stderr
                until(lambda: "paused" in cli(env, "status", run).stdout, what="gate")
                until(lambda: _up(base + "/"), what="the ui")
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"]
                )
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                _sign_in(page, base)
                expect(page.locator(f"a[href='/runs/{run}']")).to_be_visible(
                    timeout=30_000
                )  # the runs list, as projected
                page.click(f"a[href='/runs/{run}']")
                expect(page.locator("#status")).to_have_text("paused")
                expect(page.locator("#approval")).to_contain_text("create_ticket")
                expect(page.locator("#args")).to_contain_text("title")
                expect(page.locator("#conversation")).to_contain_text("a browser")
                page.screenshot(path=str(shots / "ui-run-paused.png"), full_page=True)
                _refusals(p, page, base, run)
                # A person reads the arguments for a while; the page refreshes every
                # second meanwhile and must not lose the form.
                page.wait_for_timeout(5_500)
                # The approver edits the arguments before approving.
                page.click("#approval summary")
                page.fill("#edited-args", '{"title": "Edited in the browser"}')
                page.click("#approve")
                expect(page.locator("#verdict")).to_contain_text("applied")
                expect(page.locator("#status")).to_have_text(
                    "completed", timeout=30_000
                )
                expect(page.locator("#verdict")).to_contain_text("applied")  # stays
                expect(page.locator("#approval")).to_have_count(0)
                expect(page.locator("#timeline")).to_contain_text("run_completed")
                page.screenshot(
                    path=str(shots / "ui-run-completed.png"), full_page=True
                )
                _other_pages(page, base)
                browser.close()
            finally:
                projector.terminate()
                projector.wait(30)
        shown = cli(env, "status", run, "-o", "json").stdout
        assert '"completed"' in shown
        replayed = cli(env, "replay", run, "-o", "json").stdout
        assert '"by": "ann"' in replayed
        assert "Edited in the browser" in replayed  # the call ran with the edit
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    # uvicorn shuts down cleanly, then re-raises the SIGTERM it caught.
    assert server.returncode in (0, -15), err[-3000:]


def test_a_thread_in_the_browser(env: dict[str, str], tmp_path: Path) -> None:
    """The message box of a thread: send a message, read the answer, end it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = f"ui-thread-{uuid.uuid4().hex[:8]}"
    users = _users(env, tmp_path / "users")
    server = subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", "ui", "--port", str(port),
         "--users", str(users)],
        cwd=ROOT, env=_env(**env), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with worker(env, "tests.agents:desk"), sync_playwright() as p:
            started = cli(env, "start", "desk", "--run-id", run, "--input", '"hi"')
            assert started.returncode == 0, started.stderr
            until(lambda: "awaiting_message" in cli(env, "status", run).stdout,
                  what="the first answer")  # fmt: skip
            until(lambda: _up(base + "/"), what="the ui")
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"]
            )
            page = browser.new_page()
            _sign_in(page, base)
            page.goto(f"{base}/runs/{run}")
            expect(page.locator("#conversation")).to_contain_text("How can I help?")
            page.fill("#message", "Where is my parcel?")
            page.click("#send")
            expect(page.locator("#verdict")).to_contain_text("applied")
            # The answer as it streams, from the call in flight (server-sent events
            # over the page's session): every piece, then done.
            streamed = page.request.get(f"{base}/runs/{run}/stream").text()
            pieces = re.findall(r"event: text\ndata: (\{.*\})", streamed)
            assert "".join(json.loads(piece)["text"] for piece in pieces).endswith(
                "ships today."
            ), streamed
            assert "event: done" in streamed
            expect(page.locator("#conversation")).to_contain_text(
                "ann: Where is my parcel?", timeout=30_000
            )
            expect(page.locator("#conversation")).to_contain_text(
                "Your parcel ships today.", timeout=30_000
            )
            page.click("#end")
            expect(page.locator("#status")).to_have_text("completed", timeout=30_000)
            browser.close()
        shown = json.loads(cli(env, "status", run, "-o", "json").stdout)
        assert json.loads(shown["output"]) == {
            "answer": "Your parcel ships today.",
            "turns": 1,
        }
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert server.returncode in (0, -15), err[-3000:]


def test_a_budget_decision_in_the_browser(env: dict[str, str], tmp_path: Path) -> None:
    """A run paused at its budget: the page says which limit, Grant gives it as
    much again, Stop ends it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = f"ui-budget-{uuid.uuid4().hex[:8]}"
    users = _users(env, tmp_path / "users")
    server = subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", "ui", "--port", str(port),
         "--users", str(users)],
        cwd=ROOT, env=_env(**env), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    budget = json.dumps({"max_model_calls": 2, "on_exceeded": "pause"})
    try:
        with worker(env, "tests.agents:longwinded"), sync_playwright() as p:
            started = cli(env, "start", "longwinded", "--run-id", run,
                          "--budget", budget)  # fmt: skip
            assert started.returncode == 0, started.stderr
            until(lambda: "budget_exceeded" in cli(env, "status", run).stdout,
                  what="the budget pause")  # fmt: skip
            until(lambda: _up(base + "/"), what="the ui")
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"]
            )
            page = browser.new_page()
            _sign_in(page, base)
            page.goto(f"{base}/runs/{run}")
            expect(page.locator("#budget-why")).to_contain_text(
                "2 model calls of at most 2"
            )
            page.click("#grant")
            expect(page.locator("#verdict")).to_contain_text("applied")
            expect(page.locator("#budget-why")).to_contain_text(
                "4 model calls of at most 4", timeout=30_000
            )
            page.fill("#reason", "enough")
            page.click("#stop")
            expect(page.locator("#status")).to_have_text("failed", timeout=30_000)
            browser.close()
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert server.returncode in (0, -15), err[-3000:]


def _adduser(env: dict[str, str], path: Path, name: str) -> None:
    added = subprocess.run(
        [sys.executable, "-m", "es_agents.cli", "ui", "adduser", name, "--users",
         str(path), "--password-stdin"],
        input=f"{name} horse\n", cwd=ROOT, env=_env(**env), capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr


def test_signed_approvals_from_the_page(env: dict[str, str], tmp_path: Path) -> None:
    """A four-eyes gate that takes signed decisions only: an unsigned approval
    from the page is refused; alice and bob each sign in the browser with their own
    key file (the key never leaves the page) and the wire goes out."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    users = tmp_path / "users"
    keys = {}
    for name, roles in (("alice", []), ("bob", ["--role", "finance"])):
        _adduser(env, users, name)
        keys[name] = tmp_path / f"{name}.key"
        made = cli(env, "keys", "new", "--identity", name, "--out", str(keys[name]),
                   *roles)  # fmt: skip
        assert made.returncode == 0, made.stderr
    server = subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", "ui", "--port", str(port),
         "--users", str(users)],
        cwd=ROOT, env=_env(**env), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with worker(env, "tests.secure_agents:four_eyes"), sync_playwright() as p:
            started = cli(env, "start", "four-eyes", "-o", "json")
            assert started.returncode == 0, started.stderr
            run = json.loads(started.stdout)["run_id"]
            until(lambda: "paused" in cli(env, "status", run).stdout, what="the gate")
            until(lambda: _up(base + "/"), what="the ui")
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"]
            )
            for name in ("alice", "bob"):
                page = browser.new_context().new_page()
                page.goto(base + "/login")
                page.fill("#name", name)
                page.fill("#password", f"{name} horse")
                page.click("#sign-in")
                expect(page.locator("#who")).to_have_text(name)
                page.goto(f"{base}/runs/{run}")
                if name == "alice":  # unsigned: refused, the gate says why
                    page.click("#approve")
                    expect(page.locator("#verdict")).to_contain_text("refused")
                page.click("#signing summary")
                page.set_input_files("#key-file", str(keys[name]))
                page.click("#sign-approve")
                expect(page.locator("#verdict")).to_contain_text("applied")
            expect(page.locator("#status")).to_have_text("completed", timeout=30_000)
            browser.close()
        timeline = json.loads(cli(env, "show", run, "-o", "json").stdout)
        said = json.dumps(timeline)
        assert [e["type"] for e in timeline].count("tool_returned") == 1
        assert "alice" in said
        assert "bob" in said  # both signed approvals recorded
        assert b"PRIVATE KEY" not in users.read_bytes()
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert server.returncode in (0, -15), err[-3000:]
