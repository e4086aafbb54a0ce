-- Fencing tokens for tools: each time a worker is assigned a partition it takes the
-- next epoch of that partition here, and passes it to every tool call it makes for
-- the partition's runs (ToolContext.epoch). A downstream that remembers the highest
-- epoch it saw per partition can refuse a call with a lower one: a zombie's.
CREATE TABLE partition_epochs (
    group_id   text    NOT NULL,
    partition  integer NOT NULL,
    epoch      bigint  NOT NULL,
    taken_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, partition)
);
