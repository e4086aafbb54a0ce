"""`es-agents ui` in a real browser (Playwright driving Debian's chromium, started
by the test): open a paused run, read the arguments being approved, approve it in
the page, and watch it complete. Also the runs list, the dead letters and costs.
``ES_AGENTS_UI_SCREENSHOTS=DIR`` saves the pages' screenshots there (docs/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

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


def test_approve_a_paused_run_in_the_browser(
    env: dict[str, str], tmp_path: Path
) -> None:
    assert Path(CHROMIUM).exists(), "Debian's chromium: apt-get install chromium"
    shots = Path(os.environ.get("ES_AGENTS_UI_SCREENSHOTS", tmp_path))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    run = f"ui-{uuid.uuid4().hex[:8]}"
    server = subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", "ui", "--port", str(port)],
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
                page.goto(base + "/")
                expect(page.locator(f"a[href='/runs/{run}']")).to_be_visible(
                    timeout=30_000
                )  # the runs list, as projected
                page.click(f"a[href='/runs/{run}']")
                expect(page.locator("#status")).to_have_text("paused")
                expect(page.locator("#approval")).to_contain_text("create_ticket")
                expect(page.locator("#args")).to_contain_text("title")
                page.screenshot(path=str(shots / "ui-run-paused.png"), full_page=True)
                page.fill("#by", "ann")
                page.click("#approve")
                expect(page.locator("#verdict")).to_contain_text("applied")
                expect(page.locator("#status")).to_have_text(
                    "completed", timeout=30_000
                )
                expect(page.locator("#timeline")).to_contain_text("run_completed")
                page.screenshot(
                    path=str(shots / "ui-run-completed.png"), full_page=True
                )
                page.goto(base + "/costs")
                expect(page.locator("body")).to_contain_text("research")
                page.goto(base + "/dlq")
                expect(page.locator("h1")).to_have_text("Dead letters")
                browser.close()
            finally:
                projector.terminate()
                projector.wait(30)
        shown = cli(env, "status", run, "-o", "json").stdout
        assert '"completed"' in shown
        assert '"by": "ann"' in cli(env, "replay", run, "-o", "json").stdout
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    # uvicorn shuts down cleanly, then re-raises the SIGTERM it caught.
    assert server.returncode in (0, -15), err[-3000:]
