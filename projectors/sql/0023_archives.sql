-- Retention of finished runs (es_agents/retention.py). A finished run's events are
-- written to the object store as one Avro object container file, recorded here;
-- then its projection rows (events, snapshots, transcript chunks) are purged. The
-- runs row stays, with this one beside it: a command for the run is refused as
-- archived (never taken for an unknown run, which a start could reuse), and
-- `es-agents restore` reads the archive back.
CREATE TABLE IF NOT EXISTS run_archives (
    run_id      text        PRIMARY KEY,
    key         text        NOT NULL,  -- the object's key in the payload bucket
    sha256      text        NOT NULL,  -- of the object's bytes
    events      integer     NOT NULL,
    last_seq    bigint      NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    purged_at   timestamptz
);
-- Which runs' events claim which payload objects (written by the projector): an
-- object is deleted with a run only when no other run claims it (a fork's copied
-- events claim its origin's objects; equal payloads share one object).
CREATE TABLE IF NOT EXISTS payload_refs (
    key    text NOT NULL,
    run_id text NOT NULL,
    PRIMARY KEY (key, run_id)
);
CREATE INDEX IF NOT EXISTS payload_refs_run ON payload_refs (run_id);
-- Objects no run claims any more, to delete once they were written longer ago than
-- the grace period (a run still going may have just stored the same bytes).
CREATE TABLE IF NOT EXISTS payload_orphans (
    key   text        PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'es_reader') THEN
        GRANT SELECT ON run_archives, payload_refs, payload_orphans
            TO es_reader, es_client, es_worker, es_projector;
        GRANT INSERT, UPDATE, DELETE ON run_archives, payload_refs, payload_orphans
            TO es_worker, es_projector;
        GRANT DELETE ON run_events, run_snapshots, run_transcripts TO es_worker;
        GRANT INSERT ON run_events TO es_worker;
    END IF;
END
$$;
