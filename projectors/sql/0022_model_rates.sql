-- The models' rate limits (core/rates), shared by every worker of a topic prefix:
-- one row per model id with the current one-minute window's requests and tokens,
-- and the end of a cool-down after the model said 429 with a Retry-After. A worker
-- takes a request under the row's lock. A row written by anyone else can delay or
-- hurry model calls -- it cannot make a run act.
CREATE TABLE IF NOT EXISTS model_rates (
    topic_prefix text        NOT NULL,
    model_id     text        NOT NULL,
    window_start timestamptz NOT NULL,
    requests     integer     NOT NULL DEFAULT 0,
    tokens       bigint      NOT NULL DEFAULT 0,
    cool_until   timestamptz,
    PRIMARY KEY (topic_prefix, model_id)
);
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'es_reader') THEN
        GRANT SELECT ON model_rates TO es_reader, es_client, es_worker, es_projector;
        GRANT INSERT, UPDATE, DELETE ON model_rates TO es_worker;
    END IF;
END
$$;
