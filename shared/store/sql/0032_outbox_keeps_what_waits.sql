-- The outbox holds what waits to be published, and nothing else. A row confirmed by
-- the broker was marked (`published_at`: a new version of the row and an entry in each of its
-- indexes) and deleted an hour later by the prune; meanwhile the table held an hour of traffic
-- (nine rows a job), and a probe for unnumbered events that the planner made a sequential scan
-- read all of it at every batch (9,200 rows, 3.8 ms a call, during one job x 5,000). Now the
-- relay deletes a row once the broker confirmed it, in the statement that reads the next batch,
-- as it marked it before. What was published stays in the event history (`events`, numbered
-- as before); a work message lived only to be delivered.
DELETE FROM outbox WHERE published_at IS NOT NULL;
DROP INDEX outbox_published;
DROP INDEX outbox_pending;
ALTER TABLE outbox DROP COLUMN published_at;

-- As in 0021, with the confirmed rows deleted rather than marked, and every read an ordered
-- read of the primary key. Every row of a queue table ends deleted, and until a vacuum its
-- heap holds them all: a sequential scan (which the planner chose for a probe, on statistics
-- that say the table is small or that matches are many) reads every one, where an index scan
-- skips the entries it found dead before.
CREATE OR REPLACE FUNCTION outbox_batch(lim integer, confirmed bigint[])
RETURNS TABLE (id bigint, exchange text, routing_key text, body text,
               created_at timestamptz, seq bigint)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    base bigint;
BEGIN
    DELETE FROM outbox o WHERE o.id = ANY(confirmed);
    IF (SELECT o.id FROM outbox o WHERE o.seq IS NULL AND o.exchange = 'events'
        ORDER BY o.id LIMIT 1) IS NOT NULL THEN
        SELECT p.last_given INTO base FROM event_positions p FOR UPDATE;
        WITH todo AS (
            SELECT o.id, row_number() OVER (ORDER BY o.id) AS k FROM outbox o
            WHERE o.seq IS NULL AND o.exchange = 'events'
            ORDER BY o.id LIMIT lim
        ), moved AS (
            UPDATE outbox o SET seq = base + t.k FROM todo t WHERE o.id = t.id
            RETURNING o.seq, o.routing_key, o.body, o.created_at
        ), logged AS (
            INSERT INTO events (seq, job_id, routing_key, body, created_at)
            SELECT m.seq,
                   CASE WHEN split_part(m.routing_key, '.', 1) IN ('job', 'task')
                        THEN split_part(m.routing_key, '.', 3) END,
                   m.routing_key, m.body || jsonb_build_object('seq', m.seq), m.created_at
            FROM moved m
            RETURNING 1
        )
        UPDATE event_positions SET last_given = base + (SELECT count(*) FROM logged);
    END IF;
    RETURN QUERY
        SELECT o.id, o.exchange, o.routing_key,
               (CASE WHEN o.seq IS NULL THEN o.body
                     ELSE o.body || jsonb_build_object('seq', o.seq) END)::text,
               o.created_at, o.seq
        FROM outbox o
        WHERE o.seq IS NOT NULL OR o.exchange = 'work'
        ORDER BY o.id LIMIT lim;
END $$;
