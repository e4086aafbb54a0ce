-- Roles, least privilege (each a NOLOGIN group role: make login users members,
-- e.g. CREATE USER projector1 PASSWORD '...' IN ROLE es_projector):
--   es_reader     reads everything (the UI, status, replay, audit, dashboards)
--   es_client     a reader that also sends commands (start, approve, forget, ...)
--   es_worker     writes the effect ledger, timers, verdicts, epochs, data keys
--   es_projector  writes the projections (runs, events, snapshots, transcripts)
-- With the Postgres store, the log's tables are written by clients (commands),
-- workers (events) and both consumer groups (their offsets and leases).
-- Approvers' keys are written by the owner of the schema only (es-agents keys new).
-- Creating roles needs CREATEROLE: without it this migration only grants to the
-- roles that exist, and says so.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['es_reader', 'es_client', 'es_worker', 'es_projector']
    LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN insufficient_privilege THEN
                    RAISE NOTICE 'es-agents: cannot create role % (no CREATEROLE)', r;
                -- Roles belong to the server, not to a database: another database's
                -- migration on the same server may have made it since the check.
                WHEN duplicate_object OR unique_violation THEN
                    NULL;
            END;
        END IF;
    END LOOP;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'es_reader') THEN
        RETURN;
    END IF;
    GRANT USAGE ON SCHEMA public TO es_reader, es_client, es_worker, es_projector;
    GRANT SELECT ON ALL TABLES IN SCHEMA public
        TO es_reader, es_client, es_worker, es_projector;
    GRANT USAGE ON ALL SEQUENCES IN SCHEMA public
        TO es_client, es_worker, es_projector;
    -- commands and their verdicts; data keys of encrypted runs (inputs, forget)
    GRANT INSERT, UPDATE ON commands, run_keys TO es_client, es_worker;
    GRANT INSERT, UPDATE, DELETE ON effects, timers, agents, partition_epochs
        TO es_worker;
    GRANT INSERT, UPDATE, DELETE
        ON runs, run_events, run_snapshots, run_transcripts, projector_offsets,
           dead_letters
        TO es_projector;
    -- the Postgres store's log: appends by clients and workers, groups by both
    GRANT INSERT, UPDATE ON log_records, log_heads TO es_client, es_worker;
    GRANT INSERT, UPDATE, DELETE ON log_members, log_owners, log_offsets
        TO es_worker, es_projector;
END
$$;
