-- The read side the projector materializes from es.events. Users query these tables.

-- One row per run: its status and what it waits for, as of its last projected event.
CREATE TABLE runs (
    run_id            text PRIMARY KEY,
    agent             text        NOT NULL,
    status            text        NOT NULL,  -- running | paused | blocked | completed | failed
    step              integer     NOT NULL,
    last_seq          bigint      NOT NULL,
    waiting_reason    text,                  -- awaiting_approval | awaiting_input | sleeping | uncertain_effect | version_mismatch
    waiting_gate      text,
    wake_at           timestamptz,
    agent_version     text        NOT NULL DEFAULT '',
    code_revision     text        NOT NULL DEFAULT '',
    prompt_hash       text        NOT NULL DEFAULT '',
    model_id          text        NOT NULL DEFAULT '',
    tools_hash        text        NOT NULL DEFAULT '',
    reducer_version   integer     NOT NULL DEFAULT 1,
    prompt_tokens     bigint      NOT NULL DEFAULT 0,
    completion_tokens bigint      NOT NULL DEFAULT 0,
    model_calls       integer     NOT NULL DEFAULT 0,
    tool_calls        integer     NOT NULL DEFAULT 0,
    reconciled_calls  integer     NOT NULL DEFAULT 0,
    output_json       text,
    error             text,
    partition         integer     NOT NULL,
    last_offset       bigint      NOT NULL,
    started_at        timestamptz,
    updated_at        timestamptz
);
CREATE INDEX runs_status ON runs (status);
CREATE INDEX runs_partition_running ON runs (partition) WHERE status = 'running';

-- Every event, with its Avro bytes as written (decodable with schemas/ alone).
CREATE TABLE run_events (
    run_id     text        NOT NULL,
    seq        bigint      NOT NULL,
    step       integer     NOT NULL,
    type       text        NOT NULL,
    event_id   text        NOT NULL,
    at         timestamptz NOT NULL,
    partition  integer     NOT NULL,
    "offset"   bigint      NOT NULL,
    payload    bytea       NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- The fold of a run's events 0..seq, every K events and at every interrupt and end.
CREATE TABLE run_snapshots (
    run_id          text        NOT NULL,
    seq             bigint      NOT NULL,
    reducer_version integer     NOT NULL,
    partition       integer     NOT NULL,
    "offset"        bigint      NOT NULL,   -- the log position the snapshot covers
    state           jsonb       NOT NULL,
    taken_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

-- The projector's position, written in the same transaction as the rows above.
CREATE TABLE projector_offsets (
    group_id    text    NOT NULL,
    topic       text    NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint  NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
