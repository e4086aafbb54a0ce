-- Each transcript chunk carries a MAC the projector makes over the run, the chunk's
-- number and its messages (core/authorship). A resumed run sends its model only
-- chunks that verify; one that does not is rebuilt from the projected events (each
-- verified and chained) and reported. Rows written before have none: rebuilt too.
ALTER TABLE run_transcripts ADD COLUMN IF NOT EXISTS mac text;
