-- Model answers while they stream, on the Postgres-only store (on Kafka: the
-- <prefix>.stream topic). Not part of the log: unlogged (lost in a crash of the
-- server, which is a gap in what a watcher sees, never in a run) and kept an hour.
CREATE UNLOGGED TABLE IF NOT EXISTS stream_deltas (
    id bigserial PRIMARY KEY,
    prefix text NOT NULL,
    run_id text NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    step integer NOT NULL,
    attempt integer NOT NULL,
    kind text NOT NULL,
    text text NOT NULL,
    sent_at double precision NOT NULL
);
CREATE INDEX IF NOT EXISTS stream_deltas_run ON stream_deltas (prefix, run_id, id);
CREATE INDEX IF NOT EXISTS stream_deltas_at ON stream_deltas (at);
