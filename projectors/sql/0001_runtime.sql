-- The worker's read-write tables: the effect ledger and durable timers.

-- Idempotency ledger for side-effecting tools whose downstream cannot honor keys.
-- A row is inserted ('started') before the call and completed ('done') after it; a
-- crash in between leaves 'started', which recovery treats as an uncertain effect.
CREATE TABLE effects (
    idempotency_key text PRIMARY KEY,          -- run_id:step
    run_id          text        NOT NULL,
    step            integer     NOT NULL,
    tool            text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('started', 'done')),
    result_json     text,
    error           text,
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX effects_run ON effects (run_id);

-- Durable timers: a sleeping run is a row here until its due time, by this clock.
CREATE TABLE timers (
    timer_id  text PRIMARY KEY,                -- run_id:seq of the interrupted event
    run_id    text        NOT NULL,
    due_at    timestamptz NOT NULL,
    fired_at  timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX timers_due ON timers (due_at) WHERE fired_at IS NULL;
