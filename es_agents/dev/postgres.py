"""PostgreSQL from Debian's packages, in its own data directory on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

from es_agents.dev.config import DevSettings
from es_agents.dev.process import (
    ManagedProcess,
    apt_install,
    require_free_port,
    run,
    wait_for,
)
from es_agents.errors import ConfigError, Unavailable


def _bin_dir() -> Path | None:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: (
            int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0
        ),
    )
    return candidates[-1].parent if candidates else None


class DevPostgres:
    name = "postgres"

    def __init__(self, dev: DevSettings) -> None:
        self.dev = dev
        self.dir = dev.root / "postgres"
        self.proc = self._process(self.data_dir(create=False))

    @property
    def endpoint(self) -> str:
        return self.dev.database_url

    @property
    def _as_root(self) -> bool:
        return os.geteuid() == 0

    def _user(self) -> str | None:
        # initdb refuses to run as root; the Debian package brings a postgres user.
        return "postgres" if self._as_root else None

    def data_dir(self, create: bool = True) -> Path:
        """The cluster's directory: in the project, or where user postgres can reach.

        As root the server runs as user ``postgres``, which must be able to traverse
        every parent directory; a project under a private home gets its cluster in
        /var/tmp instead, and ``location`` remembers where.
        """
        pointer = self.dir / "location"
        if pointer.exists():
            return Path(pointer.read_text().strip())
        base = self.dir / "cluster"
        if not create:
            return base / "data"
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._as_root and not _reachable_by_postgres(self.dir):
            digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]
            base = Path("/var/tmp") / f"es-agents-{digest}"  # noqa: S108
        pointer.write_text(str(base / "data") + "\n")
        return base / "data"

    def _process(self, data: Path) -> ManagedProcess:
        return ManagedProcess(
            "postgres", self.dir / "postgres.pid", data.parent / "postgres.log"
        )

    def install(self) -> Path:
        bindir = _bin_dir()
        if bindir is not None:
            return bindir
        if not self._as_root or shutil.which("apt-get") is None:
            raise ConfigError(
                "PostgreSQL is not installed: sudo apt-get install -y postgresql "
                "(or point ES_AGENTS_DATABASE_URL at a server)"
            )
        apt_install(["postgresql"])
        bindir = _bin_dir()
        if bindir is None:
            raise ConfigError("apt-get installed postgresql but no initdb was found")
        return bindir

    def start(self) -> bool:
        if self.proc.pid() is not None:
            self.wait_ready()
            return False
        require_free_port(self.dev.host, self.dev.postgres_port, "postgres")
        bindir = self.install()
        data = self.data_dir()
        user = self._user()
        self.proc = self._process(data)
        if not (data / "PG_VERSION").exists():
            data.parent.mkdir(parents=True, exist_ok=True)
            if user is not None:
                shutil.chown(data.parent, user, user)
            run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                ],
                "initdb",
                user=user,
            )
        options = {
            "port": str(self.dev.postgres_port),
            "listen_addresses": self.dev.host,
            "unix_socket_directories": str(data.parent),
            "fsync": "on" if self.dev.postgres_fsync else "off",
            "max_connections": "200",
            "shared_buffers": "256MB",
        }
        argv = [str(bindir / "postgres"), "-D", str(data)]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        self.proc.spawn(argv, user=user)
        self.wait_ready()
        self.create_database("es_agents")
        return True

    def answers(self) -> bool:
        import psycopg  # noqa: PLC0415

        try:
            with psycopg.connect(self._url("postgres"), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def _url(self, database: str) -> str:
        return (
            f"postgresql://postgres@{self.dev.host}:{self.dev.postgres_port}/{database}"
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.proc.pid() is None:
                raise Unavailable(
                    f"postgres exited during start:\n{self.proc.log_tail()}"
                )
            return self.answers()

        if not wait_for(ready, timeout, interval=0.1):
            raise Unavailable(f"postgres did not answer in {timeout}s")

    def create_database(self, name: str) -> None:
        import psycopg  # noqa: PLC0415
        from psycopg import sql  # noqa: PLC0415

        with psycopg.connect(self._url("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        import psycopg  # noqa: PLC0415
        from psycopg import sql  # noqa: PLC0415

        with psycopg.connect(self._url("postgres"), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)
                )
            )

    def stop(self) -> bool:
        # SIGINT is Postgres's "fast" shutdown: roll back sessions, checkpoint, exit.
        return self.proc.stop(signal.SIGINT, timeout=60)


def _reachable_by_postgres(path: Path) -> bool:
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    # access(2) needs search permission on every ancestor, so one test covers the path.
    result = subprocess.run(
        ["runuser", "-u", "postgres", "--", "test", "-x", str(path)], check=False
    )
    return result.returncode == 0
