-- run_events no longer repeats the log. Each row says where an event is (partition,
-- offset) and what it is (seq, step, type, time); its bytes, and with them its
-- event id, stay in the log.
-- What a resume folds -- the events from a run's latest snapshot on, the
-- snapshot's own event included (its digest is the chain's head) -- is kept with
-- its bytes and writer MAC in run_tails, and the projector deletes a run's tail
-- rows below each new snapshot, so the table holds at most K rows per run.
-- Readers of a whole run (show, replay, archive, upgrade check) read the log.
CREATE TABLE IF NOT EXISTS run_tails (
    run_id  text   NOT NULL,
    seq     bigint NOT NULL,
    payload bytea  NOT NULL,  -- the event's Avro bytes as written
    mac     text,             -- the record's writer MAC
    PRIMARY KEY (run_id, seq)
);
-- A queue's table: autovacuum comes after a fixed number of rows deleted, not a
-- share of the table (the projector also vacuums it when it owns it).
ALTER TABLE run_tails SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 1000
);
-- The tails of the runs projected so far: from each run's latest snapshot on (from
-- seq 0 for a run without one).
INSERT INTO run_tails (run_id, seq, payload, mac)
SELECT e.run_id, e.seq, e.payload, e.mac
FROM run_events e
LEFT JOIN (
    SELECT run_id, max(seq) AS seq FROM run_snapshots GROUP BY run_id
) s ON s.run_id = e.run_id
WHERE e.seq >= COALESCE(s.seq, 0)
ON CONFLICT DO NOTHING;
-- Dropping a column is immediate; the space of the old bytes is reused as rows are
-- rewritten (VACUUM FULL run_events gives it back at once).
ALTER TABLE run_events DROP COLUMN IF EXISTS payload, DROP COLUMN IF EXISTS mac,
    DROP COLUMN IF EXISTS event_id;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'es_reader') THEN
        GRANT SELECT ON run_tails TO es_reader, es_client, es_worker, es_projector;
        GRANT INSERT, UPDATE, DELETE ON run_tails TO es_projector;
        GRANT INSERT, DELETE ON run_tails TO es_worker;  -- restore and purge
    END IF;
END
$$;
