"""Who is on the page: sign-in, sessions and CSRF tokens for ``es-agents ui``.

Three ways to know the person, one per deployment:

- ``Users``: a file of names and scrypt password hashes (``es-agents ui adduser``
  writes it); the page asks for a name and password.
- a proxy's identity header (``--user-header``): a reverse proxy that authenticated
  the person names them; the page trusts that header and nothing else.
- neither: a token printed when the UI starts (as notebook servers do); opening the
  printed address signs the browser in as the local user.

A signed-in session is a signed cookie (Starlette's ``SessionMiddleware``, with
``itsdangerous``), ``SameSite=Lax``: sent on links from elsewhere, never on their
POSTs. Every POST carries the session's CSRF token (a form field or the
``X-CSRF-Token`` header, which htmx sends) and, when the browser says where it comes
from, an ``Origin`` of this host: a form on another site cannot decide anything
here even with the cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

from starlette.requests import Request

_N, _R, _P = 2**14, 8, 1  # scrypt cost: ~50 ms and 16 MiB a check
SESSION_USER = "user"
SESSION_CSRF = "csrf"
CSRF_HEADER = "x-csrf-token"


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash``, salt and hash in base64."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return "$".join(("scrypt", str(_N), str(_R), str(_P), _b64(salt), _b64(digest)))


def check_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(base64.b64decode(digest)),
        )
    except ValueError:
        return False
    return hmac.compare_digest(got, base64.b64decode(digest))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@final
class Users:
    """A users file: one ``name:hash`` per line; ``#`` starts a comment."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._hashes: dict[str, str] = {}
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, stored = line.partition(":")
            if not sep or not name or not stored.startswith("scrypt$"):
                raise ValueError(
                    f"{path}:{number}: not 'name:scrypt$...' "
                    "(write users with `es-agents ui adduser`)"
                )
            self._hashes[name] = stored

    def __len__(self) -> int:
        return len(self._hashes)

    def check(self, name: str, password: str) -> bool:
        stored = self._hashes.get(name)
        if stored is None:
            check_password(password, hash_password("x"))  # the same time either way
            return False
        return check_password(password, stored)

    @staticmethod
    def add(path: Path, name: str, password: str) -> None:
        """Add ``name`` to the file (or replace its hash); the file is created
        readable by its owner only."""
        if not name or ":" in name or name != name.strip():
            raise ValueError(f"user name {name!r}: no colon, no surrounding spaces")
        if len(password) < 8:
            raise ValueError("a password of at least 8 characters")
        lines = path.read_text().splitlines() if path.exists() else []
        kept = [line for line in lines if line.partition(":")[0] != name]
        kept.append(f"{name}:{hash_password(password)}")
        path.touch(mode=0o600, exist_ok=True)
        path.write_text("\n".join(kept) + "\n")


@dataclass(frozen=True)
class SignIn:
    """How this UI knows people (exactly one of the three is in use)."""

    users: Users | None = None
    user_header: str | None = None
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    token_user: str = "local"  # noqa: S105 - a user name, not a secret

    @property
    def mode(self) -> str:
        if self.user_header:
            return "header"
        return "password" if self.users is not None else "token"

    def identity(self, request: Request) -> str | None:
        """The person making ``request``, or None when nobody is signed in."""
        if self.user_header:
            return request.headers.get(self.user_header) or None
        user = request.session.get(SESSION_USER)
        return user if isinstance(user, str) and user else None

    def sign_in(self, request: Request, form: dict[str, str]) -> str | None:
        """Check what the login form (or the printed address) gave; on success the
        session names the person. Returns the refusal, or None."""
        if self.users is not None and not self.user_header:
            name = form.get("name", "")
            if not self.users.check(name, form.get("password", "")):
                return "unknown name or wrong password"
            user = name
        elif self.mode == "token":
            if not hmac.compare_digest(form.get("token", ""), self.token):
                return "wrong token (it is printed where the UI was started)"
            user = self.token_user
        else:
            return "signed in by the proxy"
        request.session.clear()  # a new session: nothing carried over
        request.session[SESSION_USER] = user
        request.session[SESSION_CSRF] = secrets.token_urlsafe(32)
        return None


def csrf_token(request: Request) -> str:
    """The session's CSRF token (made on first use)."""
    token = request.session.get(SESSION_CSRF)
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        request.session[SESSION_CSRF] = token
    return token


def cross_site(request: Request, form_token: str | None) -> str | None:
    """Why ``request`` (a POST) may not be this site's own page, or None."""
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        host = request.headers.get("host", "")
        if origin.split("://", 1)[-1] != host:
            return f"cross-site request from {origin}"
    elif origin == "null":
        return "cross-site request from an opaque origin"
    expected = request.session.get(SESSION_CSRF)
    given = request.headers.get(CSRF_HEADER) or form_token or ""
    if not isinstance(expected, str) or not hmac.compare_digest(given, expected):
        return "missing or wrong CSRF token (reload the page)"
    return None
