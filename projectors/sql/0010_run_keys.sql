-- Data keys of runs whose agent encrypts its payloads, wrapped (AES-GCM) by the
-- master key named by master_key_id. `es-agents forget RUN` sets wrapped to NULL:
-- the run's payloads are unreadable everywhere from then on.
CREATE TABLE IF NOT EXISTS run_keys (
    run_id         text PRIMARY KEY,
    wrapped        bytea,
    master_key_id  text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    forgotten_at   timestamptz,
    CHECK ((wrapped IS NULL) = (forgotten_at IS NOT NULL))
);
