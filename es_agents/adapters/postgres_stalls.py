"""Ending the sessions a stalled process of ours left inside a transaction.

A process paused in the middle of a pipeline (psycopg pipelines ``executemany``) --
SIGSTOP, a frozen VM, a debugger -- leaves its server session *active*, waiting for
the client's next message. ``idle_in_transaction_session_timeout`` never ends such
a session (the server is not idle: it is reading a request), so the row locks it
holds -- a partition's epoch, a lease, a projection's rows -- stop the member that
takes its partitions over, for as long as the process stays paused. Postgres 17's
``transaction_timeout`` would end it; for the servers before it, every worker and
projector ends such sessions of this application itself: inside a transaction,
waiting for their client, with nothing received for ``after`` seconds (a live
client sends a pipeline's next message within milliseconds, and a member silent for
the session timeout has lost its partitions anyway). A role sees the state of its
own sessions only (and, granted ``pg_signal_backend``, may end others'), so each
role ends what its own processes left.
"""

from __future__ import annotations

import logging
import threading
from typing import final

import psycopg

log = logging.getLogger(__name__)

APPLICATION = "es-agents"  # the application_name of every connection of ours


@final
class StallReaper:
    """A daemon thread ending stalled sessions of ours every ``after / 2`` seconds."""

    def __init__(self, url: str, after: float, connect_timeout: int = 5) -> None:
        self.url = url
        self.after = after
        self._connect_timeout = connect_timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="postgres-stalls", daemon=True
        )
        self._thread.start()

    def reap(self) -> list[int]:
        """End the stalled sessions now; the server pids it ended."""
        with psycopg.connect(
            self.url,
            autocommit=True,
            application_name=f"{APPLICATION} (stalls)",
            connect_timeout=self._connect_timeout,
        ) as conn:
            rows = conn.execute(
                # Materialized: the filter is applied before any pid is signalled.
                "WITH stalled AS MATERIALIZED (SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s "
                "AND pid <> pg_backend_pid() AND state = 'active' "
                "AND wait_event = 'ClientRead' AND xact_start IS NOT NULL "
                "AND state_change < now() - make_interval(secs => %s)) "
                "SELECT pid FROM stalled WHERE pg_terminate_backend(pid)",
                (APPLICATION, self.after),
            ).fetchall()
        ended = [int(r[0]) for r in rows]
        if ended:
            log.warning(
                "ended %d session(s) of a stalled process (server pids %s): inside a "
                "transaction, waiting for their client for more than %g s",
                len(ended),
                ended,
                self.after,
            )
        return ended

    def _loop(self) -> None:
        while not self._stop.wait(self.after / 2):
            try:
                self.reap()
            except psycopg.Error as e:  # the process's own work reports the outage
                log.debug("stalled sessions not checked: %s", e)

    def close(self) -> None:
        self._stop.set()
