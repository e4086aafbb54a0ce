"""Server sessions as a process paused in the middle of a pipeline leaves them."""

from __future__ import annotations

import psycopg

from es_agents.adapters.postgres_stalls import APPLICATION


def stalled_session(
    url: str, *locks: str, app: str = APPLICATION
) -> psycopg.Connection:
    """A session as a process paused in the middle of a pipeline leaves it: inside a
    transaction holding the ``locks`` statements' row locks, one more statement
    sent without the pipeline's sync -- the server waits for the client (*active*,
    ``ClientRead``), and its idle-in-transaction timeout does not apply."""
    conn = psycopg.connect(
        url,
        application_name=app,
        options="-c idle_in_transaction_session_timeout=500",
    )
    for lock in locks:
        conn.execute(lock)
    conn.pgconn.enter_pipeline_mode()
    conn.pgconn.send_query_params(b"SELECT 1", None)
    conn.pgconn.flush()
    return conn


def server_sessions(url: str) -> dict[int, tuple[str, str | None]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, state, wait_event FROM pg_stat_activity "
            "WHERE datname = current_database()"
        ).fetchall()
    return {int(pid): (state, wait) for pid, state, wait in rows}
