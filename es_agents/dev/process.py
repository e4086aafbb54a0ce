"""Background services started by ``es-agents dev up`` and stopped by pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from es_agents.errors import ConfigError, Unavailable


@dataclass(frozen=True)
class ManagedProcess:
    """A background process whose pid (and start time) live in ``pidfile``."""

    name: str
    pidfile: Path
    logfile: Path

    def pid(self) -> int | None:
        """The pid if that process still runs; the start time recorded at spawn
        guards against a recycled pid."""
        try:
            pid_text, started = self.pidfile.read_text().split()[:2]
            pid = int(pid_text)
        except (FileNotFoundError, ValueError):
            return None
        stat = _stat(pid)
        if stat is None or stat[0] == "Z" or stat[1] != started:
            return None
        return pid

    def spawn(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> int:
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                **_as_user(user),
            )
        stat = _stat(proc.pid)
        self.pidfile.write_text(f"{proc.pid} {stat[1] if stat else '?'}\n")
        return int(proc.pid)

    def send_signal(self, sig: signal.Signals) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, sig)
        return True

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 60.0) -> bool:
        """Stop the process; SIGKILL it if it outlives ``timeout``. True if it ran."""
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        os.kill(pid, sig)
        if not wait_for(lambda: self.pid() is None, timeout):
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: self.pid() is None, 10)
        self.pidfile.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(
                self.logfile.read_text(errors="replace").splitlines()[-lines:]
            )
        except FileNotFoundError:
            return "(no log)"


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require_free_port(host: str, port: int, service: str) -> None:
    """Fail early when something else listens where a service should start."""
    if not port_open(host, port):
        return
    raise ConfigError(
        f"{service}: {host}:{port} is in use by a process `dev up` did not start; "
        f"stop it or set ES_AGENTS_DEV_*_PORT"
    )


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks) of a process, from /proc/<pid>/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], fields[19]


def wait_for(
    condition: Callable[[], bool], timeout: float, interval: float = 0.05
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def require_tool(tool: str, debian_packages: Sequence[str]) -> str:
    """The path of ``tool``; as root, installs its Debian packages when missing."""
    path = shutil.which(tool)
    if path is not None:
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ConfigError(
            f"{tool} is not installed; install it with: "
            f"sudo apt-get install -y {' '.join(debian_packages)}"
        )
    apt_install(debian_packages)
    path = shutil.which(tool)
    if path is None:
        raise ConfigError(f"{tool} still missing after installing {debian_packages}")
    return path


def apt_install(packages: Sequence[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(
            ["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL
        )
        subprocess.run(
            ["apt-get", "install", "-y", "-q", *packages],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    except subprocess.CalledProcessError as e:
        raise Unavailable(f"apt-get install {' '.join(packages)} failed: {e}") from e


def run(
    argv: Sequence[str],
    what: str,
    user: str | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run a set-up command; its output becomes the error message when it fails."""
    result = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        **_as_user(user),
        env={**os.environ, **(env or {})},
        check=False,
    )
    if result.returncode != 0:
        raise Unavailable(
            f"{what} failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )
    return str(result.stdout)


def _as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments that drop root to ``user`` with its own group only."""
    if user is None:
        return {}
    return {"user": user, "group": user, "extra_groups": [], "cwd": "/"}
