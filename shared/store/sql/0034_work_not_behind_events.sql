-- Work messages no longer wait behind events. The relay read the outbox's oldest
-- rows whatever their exchange, so the 100,000 `task.new` events of a big job's submission (or
-- of a cancel of one) went out before any work message written after them: about 28 s on a
-- two-core host, during which no task of any job started and no kill was sent. Each batch now
-- carries the oldest `lim` work messages and the oldest `lim` numbered events, merged in
-- outbox order: events keep their order among themselves (their positions are given in that
-- order, as before), work messages theirs, and a backlog of one no longer holds up the other.
-- The work messages are found through an index of their own (a read of the primary key from
-- its start would pass every event ahead of them).
CREATE INDEX outbox_work ON outbox (id) WHERE exchange = 'work';

-- The numbering of a batch found its rows by their ids whatever the statistics say (the same
-- mistake as 0033's). Planned with statistics taken when the outbox was empty (as where
-- autovacuum does not analyse, and the relay's own vacuum does not either), the join of the
-- numbering's UPDATE with its batch became a nested loop whose outer side read the whole
-- outbox, running the batch's subquery again for each row: 107 s for a batch of 500 with
-- 210,000 events waiting (a job of 100,000 tasks submitted and cancelled), past the relay's
-- 30 s timeout at every try, so nothing was published again. The batch's ids are now read
-- first, under the counter's lock as before, and the UPDATE finds its rows by them.
--
-- Otherwise as in 0032, but for what it returns: two reads, one per kind, merged by id.
CREATE OR REPLACE FUNCTION outbox_batch(lim integer, confirmed bigint[])
RETURNS TABLE (id bigint, exchange text, routing_key text, body text,
               created_at timestamptz, seq bigint)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    base bigint;
    batch bigint[];
BEGIN
    DELETE FROM outbox o WHERE o.id = ANY(confirmed);
    IF (SELECT o.id FROM outbox o WHERE o.seq IS NULL AND o.exchange = 'events'
        ORDER BY o.id LIMIT 1) IS NOT NULL THEN
        SELECT p.last_given INTO base FROM event_positions p FOR UPDATE;
        -- read under the lock: what another relay numbered meanwhile is not taken again
        batch := ARRAY(SELECT o.id FROM outbox o WHERE o.seq IS NULL AND o.exchange = 'events'
                       ORDER BY o.id LIMIT lim);
        WITH moved AS (
            UPDATE outbox o SET seq = base + t.k
            FROM unnest(batch) WITH ORDINALITY AS t(id, k)
            -- `ANY(batch)` says no more than the join, but it is an index condition on the
            -- outbox whatever join the planner picks: no plan reads past the batch's rows
            WHERE o.id = ANY(batch) AND o.id = t.id
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
        SELECT b.id, b.exchange, b.routing_key,
               (CASE WHEN b.seq IS NULL THEN b.body
                     ELSE b.body || jsonb_build_object('seq', b.seq) END)::text,
               b.created_at, b.seq
        FROM ((SELECT o.* FROM outbox o WHERE o.exchange = 'work' ORDER BY o.id LIMIT lim)
              UNION ALL
              (SELECT o.* FROM outbox o WHERE o.seq IS NOT NULL ORDER BY o.id LIMIT lim)) b
        ORDER BY b.id;
END $$;
