-- Flow control (core/flow): the places of an agent's active runs, and the queue of
-- runs waiting for one. A worker takes a place for a run before its steps, under
-- the agent's advisory lock; a run that finds none waits with the reason queued
-- and a row here; as places free, a worker gives them in priority, then arrival,
-- order and wakes those runs. A row written by anyone else can hold a place or
-- reorder the queue -- it cannot make a run act: a run acts on what its log says.
CREATE TABLE IF NOT EXISTS flow_places (
    topic_prefix text        NOT NULL,
    run_id       text        NOT NULL,
    agent        text        NOT NULL,
    tenant       text,
    since        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_prefix, run_id)
);
CREATE INDEX IF NOT EXISTS flow_places_agent ON flow_places (topic_prefix, agent);
CREATE TABLE IF NOT EXISTS flow_queue (
    topic_prefix text        NOT NULL,
    run_id       text        NOT NULL,
    agent        text        NOT NULL,
    tenant       text,
    priority     integer     NOT NULL,
    seq          bigint      GENERATED ALWAYS AS IDENTITY,
    since_seq    bigint      NOT NULL,
    queued_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_prefix, run_id)
);
CREATE INDEX IF NOT EXISTS flow_queue_order
    ON flow_queue (topic_prefix, agent, priority DESC, seq);
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'es_reader') THEN
        GRANT SELECT ON flow_places, flow_queue TO es_reader, es_client, es_worker, es_projector;
        GRANT INSERT, UPDATE, DELETE ON flow_places, flow_queue TO es_worker;
    END IF;
END
$$;
