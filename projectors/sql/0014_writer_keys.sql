-- Writer keys: every record a worker appends to the events topic carries an HMAC
-- under the newest key (header es-auth), and every reader that acts on the log
-- leaves out a record without a valid one. The hash chain shows order; this shows
-- that a worker wrote the record. The first worker or projector makes the first key.
-- Readable by workers and projectors only: a client, a reader or a producer to the
-- topic cannot sign.
CREATE TABLE IF NOT EXISTS writer_keys (
    key_id      text        PRIMARY KEY,
    secret      bytea       NOT NULL CHECK (length(secret) >= 16),
    created_at  timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON writer_keys FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'es_reader') THEN
        REVOKE ALL ON writer_keys FROM es_reader, es_client;
        GRANT SELECT, INSERT ON writer_keys TO es_worker, es_projector;
    END IF;
END
$$;
