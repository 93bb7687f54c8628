-- Quarantine as a circuit breaker. A host the triage quarantines (`breaker`)
-- is shut for a cool-down, then probes: it takes one task of its pool at a time
-- (`probing_since`) until an attempt started there since ends with no failure blamed on the
-- host (closed again), or one fails on it (shut again for twice the cool-down, up to
-- `VIGIL_QUARANTINE_S`). An operator's quarantine (`breaker` false) stays a wall until it runs
-- out or is released.
ALTER TABLE hosts
    ADD COLUMN pool text,                        -- the worker pool its worker consumes
    ADD COLUMN breaker boolean NOT NULL DEFAULT false,
    ADD COLUMN cooldown_s double precision,      -- the breaker's current cool-down
    ADD COLUMN probing_since timestamptz;        -- the breaker lets one task through

-- What ran on a host since a moment (a probe's outcome; failures blamed on it within the
-- quarantine window). The old partial index listed classes that no longer blame a host.
DROP INDEX attempts_host_failures;
CREATE INDEX attempts_of_host ON attempts (host, started_at);

-- Host events (`host.<quarantined|probing|released>.<host>`) are numbered like job and task
-- events, but belong to no job.
ALTER TABLE events ALTER COLUMN job_id DROP NOT NULL;

CREATE OR REPLACE FUNCTION outbox_batch(lim integer, confirmed bigint[])
RETURNS TABLE (id bigint, exchange text, routing_key text, body text,
               created_at timestamptz, seq bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    base bigint;
BEGIN
    UPDATE outbox o SET published_at = now()
        WHERE o.id = ANY(confirmed) AND o.published_at IS NULL;
    IF EXISTS (SELECT 1 FROM outbox o WHERE o.published_at IS NULL AND o.seq IS NULL
               AND o.exchange = 'events') THEN
        SELECT p.last_given INTO base FROM event_positions p FOR UPDATE;
        WITH todo AS (
            SELECT o.id, row_number() OVER (ORDER BY o.id) AS k FROM outbox o
            WHERE o.published_at IS NULL AND o.seq IS NULL AND o.exchange = 'events'
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
        WHERE o.published_at IS NULL AND (o.seq IS NOT NULL OR o.exchange = 'work')
        ORDER BY o.id LIMIT lim;
END $$;
