-- How many partitions a topic prefix's runs were placed on. A run's commands and
-- events go to partition murmur2(run_id) mod that count: adding partitions would
-- move runs, so every process that checks the topics refuses a count that changed.
CREATE TABLE IF NOT EXISTS topic_layout (
    topic_prefix  text PRIMARY KEY,
    partitions    integer NOT NULL CHECK (partitions > 0),
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'es_reader') THEN
        GRANT SELECT ON topic_layout TO es_reader, es_client, es_worker, es_projector;
        GRANT INSERT ON topic_layout TO es_client, es_worker, es_projector;
    END IF;
END
$$;
