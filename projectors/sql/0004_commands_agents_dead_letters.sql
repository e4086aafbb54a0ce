-- What became of every command, so its sender can be told (applied or refused, and
-- why). The client writes a 'sent' row before producing; the worker that owns the
-- run's partition writes its verdict once the command's events are durable (or at
-- once when it refuses). Commands produced straight to the topic get a row from
-- the worker's verdict alone.
CREATE TABLE commands (
    command_id  text PRIMARY KEY,
    prefix      text        NOT NULL,          -- the topic prefix it was sent under
    run_id      text        NOT NULL,
    type        text        NOT NULL,          -- start_run | approve | reject | ...
    agent       text,                          -- start_run: the agent it names
    status      text        NOT NULL CHECK (status IN ('sent', 'applied', 'refused')),
    reason      text,                          -- refused: why
    sent_at     timestamptz,
    decided_at  timestamptz
);
CREATE INDEX commands_run ON commands (prefix, run_id);

-- The agents served on this cluster: each worker process writes its row when it
-- starts and every few seconds after, and marks it stopped when it stops, so a client
-- knows whether anyone serves an agent (a live row seen lately) and which gates it
-- has (from the latest row, live or not).
CREATE TABLE agents (
    prefix         text        NOT NULL,       -- the topic prefix it is served on
    agent          text        NOT NULL,
    worker_id      text        NOT NULL,       -- one per worker process
    agent_version  text        NOT NULL,
    gates          jsonb,                      -- null: the agent does not declare them
    tools          jsonb       NOT NULL,
    group_id       text        NOT NULL,
    seen_at        timestamptz NOT NULL,
    stopped_at     timestamptz,
    PRIMARY KEY (prefix, agent, worker_id)
);

-- Events the projector could not decode or fold: also in es.dlq with the reason.
-- Written in the projector's transaction, so a run's page can show them.
CREATE TABLE dead_letters (
    topic      text        NOT NULL,
    partition  integer     NOT NULL,
    "offset"   bigint      NOT NULL,
    run_id     text,                           -- the record's key
    reason     text        NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);
CREATE INDEX dead_letters_run ON dead_letters (run_id);
