-- The projection carries the writer MACs (core/authorship): each projected event
-- its record's es-auth header, each snapshot a MAC the projector makes over the run,
-- the seq, the digest of the event it was taken at and the state. A worker resumes
-- from a snapshot and projected events only when they verify; otherwise from the
-- log, and it says so. Rows written before have none and are not trusted.
ALTER TABLE run_events ADD COLUMN IF NOT EXISTS mac text;
ALTER TABLE run_snapshots ADD COLUMN IF NOT EXISTS mac text;
