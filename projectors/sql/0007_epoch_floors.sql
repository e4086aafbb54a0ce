-- Fencing by epochs in the log: each projected events partition's epoch floors (per
-- writer group, the highest epoch claimed so far) at next_offset, written with it, so
-- a projector or a run's loader that starts reading there leaves zombie writes out.
ALTER TABLE projector_offsets ADD COLUMN floors jsonb NOT NULL DEFAULT '{}';
