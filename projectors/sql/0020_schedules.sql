-- Schedules (core/schedules): runs started on a cron expression or an interval.
-- A worker of the schedule's agent writes the row when it applies a
-- change_schedule command and signs it with the writer key (mac); workers fire
-- only rows that verify, so a row written by anyone else starts nothing.
-- next_due is the first tick not yet fired; a tick's run id is derived from the
-- schedule and the tick, so firing one twice starts one run.
CREATE TABLE IF NOT EXISTS schedules (
    topic_prefix  text        NOT NULL,
    name          text        NOT NULL,
    agent         text        NOT NULL,
    input_json    text        NOT NULL,
    cron          text,
    every_seconds bigint,
    missed        text        NOT NULL,
    created_at    timestamptz NOT NULL,
    paused        boolean     NOT NULL DEFAULT false,
    next_due      timestamptz NOT NULL,
    mac           text,
    last_tick     timestamptz,
    last_run_id   text,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_prefix, name)
);
CREATE INDEX IF NOT EXISTS schedules_due
    ON schedules (topic_prefix, agent, next_due) WHERE NOT paused;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'es_reader') THEN
        GRANT SELECT ON schedules TO es_reader, es_client, es_worker, es_projector;
        GRANT INSERT, UPDATE, DELETE ON schedules TO es_worker;
    END IF;
END
$$;
