"""The models' rate limits in Postgres (``model_rates``, ``ports.ModelRates``): a
row per model id, taken ``FOR UPDATE``, by the database's clock."""

from __future__ import annotations

from typing import Any

from es_agents.adapters.postgres import Database
from es_agents.core.rates import ModelRate, Window, current, wait_for


class PostgresModelRates:
    def __init__(self, db: Database, prefix: str) -> None:
        self._db = db
        self._prefix = prefix

    def _window(self, conn: Any, model_id: str) -> tuple[Window, Any]:
        """The model's counts as of now (its row locked), and the time."""
        conn.execute(
            "INSERT INTO model_rates (topic_prefix, model_id, window_start) "
            "VALUES (%s, %s, date_trunc('minute', now())) ON CONFLICT DO NOTHING",
            (self._prefix, model_id),
        )
        row = conn.execute(
            "SELECT window_start, requests, tokens, cool_until, now() "
            "FROM model_rates WHERE topic_prefix = %s AND model_id = %s FOR UPDATE",
            (self._prefix, model_id),
        ).fetchone()
        now = row[4]
        return current(Window(row[0], row[1], row[2], row[3]), now), now

    def _keep(self, conn: Any, model_id: str, window: Window) -> None:
        conn.execute(
            "UPDATE model_rates SET window_start = %s, requests = %s, tokens = %s, "
            "cool_until = %s WHERE topic_prefix = %s AND model_id = %s",
            (
                window.start,
                window.requests,
                window.tokens,
                window.cool_until,
                self._prefix,
                model_id,
            ),
        )

    def take(self, model_id: str, rate: ModelRate) -> float:
        with self._db.transaction() as conn:
            window, now = self._window(conn, model_id)
            wait = wait_for(window, rate, now)
            if wait == 0.0:
                self._keep(
                    conn,
                    model_id,
                    Window(
                        window.start,
                        window.requests + 1,
                        window.tokens,
                        window.cool_until,
                    ),
                )
            return wait

    def spend(self, model_id: str, tokens: int) -> None:
        with self._db.transaction() as conn:
            window, _ = self._window(conn, model_id)
            self._keep(
                conn,
                model_id,
                Window(
                    window.start,
                    window.requests,
                    window.tokens + tokens,
                    window.cool_until,
                ),
            )

    def cool_down(self, model_id: str, seconds: float) -> None:
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT INTO model_rates (topic_prefix, model_id, window_start, "
                "cool_until) VALUES (%s, %s, date_trunc('minute', now()), "
                "now() + make_interval(secs => %s)) ON CONFLICT (topic_prefix, "
                "model_id) DO UPDATE SET cool_until = greatest("
                "model_rates.cool_until, EXCLUDED.cool_until)",
                (self._prefix, model_id, seconds),
            )
