-- The Postgres store (ES_AGENTS_STORE=postgres): the log itself in Postgres, for
-- deployments without Kafka. Topics keep their names (PREFIX.commands, .events,
-- .dlq) and their partitions; a record's offset is gapless per partition, taken from
-- log_heads under its row lock, so offsets commit in order and a reader that reads
-- from an offset never skips one that commits later.
CREATE TABLE log_heads (
    topic        text    NOT NULL,
    partition    integer NOT NULL,
    next_offset  bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, partition)
);

CREATE TABLE log_records (
    topic      text        NOT NULL,
    partition  integer     NOT NULL,
    "offset"   bigint      NOT NULL,
    key        text,                           -- the run id
    seq        bigint,                         -- events: the run's sequence number
    value      bytea       NOT NULL,           -- Avro, as on Kafka
    headers    jsonb,                          -- dead letters: reason and origin
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);
-- One event per (run, seq): a stale writer's append fails (fencing without a broker).
CREATE UNIQUE INDEX log_records_run_seq ON log_records (topic, key, seq)
    WHERE seq IS NOT NULL;
CREATE INDEX log_records_key ON log_records (topic, key, "offset");

-- Consumer groups: members (alive while seen lately and holding their session's
-- advisory lock), partition leases, and committed offsets.
CREATE TABLE log_members (
    group_id   text        NOT NULL,
    topic      text        NOT NULL,
    member_id  text        NOT NULL,
    lock_key   bigint      NOT NULL,
    seen_at    timestamptz NOT NULL,
    PRIMARY KEY (group_id, topic, member_id)
);

CREATE TABLE log_owners (
    group_id     text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    member_id    text,
    lease_until  timestamptz NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);

CREATE TABLE log_offsets (
    group_id     text    NOT NULL,
    topic        text    NOT NULL,
    partition    integer NOT NULL,
    next_offset  bigint  NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
