-- A run's transcript in append-only chunks of 64 messages, written by the projector
-- with each snapshot. A snapshot keeps the transcript's length, not its messages, so
-- its size does not grow with the run; only a run's latest snapshot is kept.
CREATE TABLE run_transcripts (
    run_id   text    NOT NULL,
    chunk    integer NOT NULL,
    messages jsonb   NOT NULL,
    PRIMARY KEY (run_id, chunk)
);
