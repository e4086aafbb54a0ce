"""The web UI's doors, on the memory store: nobody decides without signing in, a
POST needs the session's CSRF token and this site's origin, markup is escaped, and
the users file keeps scrypt hashes."""

from __future__ import annotations

import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from es_agents.client import Client
from es_agents.testing import AgentHarness
from es_agents.ui.app import _local, make_app
from es_agents.ui.auth import SignIn, Users, check_password, hash_password
from tests.unit.test_vault import Asker


@pytest.fixture
def client(es_harness: Callable[[Any], AgentHarness]) -> Client:
    h = es_harness(Asker())
    return Client(h.settings, ports=h.ports)


def _csrf(page: str) -> str:
    found = re.search(r'"X-CSRF-Token": "([^"]+)"', page)  # htmx sends it
    assert found, page
    return found.group(1)


def test_a_token_signs_in_the_local_user_and_posts_need_the_csrf_token(
    client: Client,
) -> None:
    doors = SignIn(token_user="ann")
    web = TestClient(make_app(client, doors), base_url="http://ui.test")
    first = web.get("/", follow_redirects=False)
    assert first.status_code == 303
    assert first.headers["location"] == "/login?next=/"
    assert web.get("/login?token=wrong").text.count('name="token"') == 1
    assert web.post("/runs/r1/approve", data={}).status_code == 401
    signed = web.get(f"/login?token={doors.token}", follow_redirects=False)
    assert signed.status_code == 303
    home = web.get("/")
    assert home.status_code == 200
    assert 'id="who">ann<' in home.text
    csrf = _csrf(home.text)
    assert web.post("/runs/r1/approve", data={}).status_code == 403  # no token
    evil = web.post(
        "/runs/r1/approve",
        data={"csrf": csrf},
        headers={"Origin": "https://evil.example"},
    )
    assert evil.status_code == 403
    assert "cross-site" in evil.text
    markup = "<img src=x onerror=alert(1)>"
    answer = web.post(f"/runs/{markup}/approve", data={"csrf": csrf})
    assert answer.status_code == 409  # an unknown run, refused by the client
    assert markup not in answer.text
    assert "&lt;img src=x onerror=alert(1)&gt;" in answer.text
    assert web.post("/runs/r1/delete", data={"csrf": csrf}).status_code == 404
    out = web.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303
    assert web.get("/", follow_redirects=False).status_code == 303  # signed out


def test_a_proxy_header_names_the_person_and_nothing_else_does(
    client: Client,
) -> None:
    web = TestClient(make_app(client, SignIn(user_header="X-User")))
    assert web.get("/", follow_redirects=False).status_code == 303
    page = web.get("/", headers={"X-User": "bob"})
    assert 'id="who">bob<' in page.text
    csrf = _csrf(page.text)
    nobody = web.post("/runs/r1/approve", data={"csrf": csrf})
    assert nobody.status_code == 401


def test_passwords_sign_in_by_name(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "users"
    Users.add(path, "ann", "correct horse")
    web = TestClient(make_app(client, SignIn(users=Users(path))))
    csrf = _csrf(web.get("/login").text)
    wrong = {"name": "ann", "password": "wrong horse", "csrf": csrf}
    assert web.post("/login", data=wrong).status_code == 401
    right = {"name": "ann", "password": "correct horse", "csrf": csrf, "next": "//x"}
    answer = web.post("/login", data=right, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/"  # not another site
    assert 'id="who">ann<' in web.get("/").text


def test_the_users_file_keeps_hashes(tmp_path: Path) -> None:
    path = tmp_path / "users"
    Users.add(path, "ann", "correct horse")
    Users.add(path, "bob", "battery staple")
    Users.add(path, "ann", "another horse")  # replaced, not doubled
    text = path.read_text()
    assert "horse" not in text
    assert text.count("ann:") == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    users = Users(path)
    assert len(users) == 2
    assert users.check("ann", "another horse")
    assert not users.check("ann", "correct horse")
    assert not users.check("carol", "another horse")
    with pytest.raises(ValueError, match="at least 8"):
        Users.add(path, "carol", "short")
    with pytest.raises(ValueError, match="no colon"):
        Users.add(path, "a:b", "long enough")
    path.write_text("ann:plaintext\n")
    with pytest.raises(ValueError, match="users:1"):
        Users(path)


def test_hashes_and_redirects() -> None:
    stored = hash_password("pw-12345678")
    assert stored.startswith("scrypt$")
    assert check_password("pw-12345678", stored)
    assert not check_password("pw-12345679", stored)
    assert not check_password("x", "scrypt$broken")
    assert _local("/runs/a") == "/runs/a"
    for target in ("//evil.example", "https://evil.example", "/\\evil", "x"):
        assert _local(target) == "/"
