-- Which store a topic prefix's log lives in. Runs, projector offsets and projections
-- are named by topic (PREFIX.events, partition, offset): the same prefix on the other
-- store would take that store's offsets for its own and hide its runs. Every process
-- that checks the topics records its store with the prefix the first time and
-- refuses the other store afterwards.
ALTER TABLE topic_layout ADD COLUMN IF NOT EXISTS store text NOT NULL DEFAULT 'kafka'
    CHECK (store IN ('kafka', 'postgres'));
-- Until now only the Kafka store recorded its prefixes; the Postgres store's are the
-- topics of its log (a prefix both stores used stays the Kafka store's).
INSERT INTO topic_layout (topic_prefix, partitions, store)
SELECT left(topic, length(topic) - length('.events')), count(*), 'postgres'
FROM log_heads WHERE topic LIKE '%.events'
GROUP BY topic
ON CONFLICT (topic_prefix) DO NOTHING;
