-- Tamper evidence and forks.
-- runs.head: the digest (hex SHA-256) of the run's last projected event as written,
-- the head of its hash chain; replay and audit check the log's chain against it.
-- runs.origin_run / origin_seq: a forked run's origin and the seq it was forked at.
ALTER TABLE runs ADD COLUMN head text NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN origin_run text;
ALTER TABLE runs ADD COLUMN origin_seq bigint;
