-- Every event (`job.*` and `task.*`, the outbox's `events` rows) gets a position in one
-- installation-wide sequence, and a history readers can replay from a position.
--
-- Positions are assigned by the relay as it reads a batch (`outbox_batch`), under the lock of
-- the one counter row: numberings are serialized and each commits before the next starts, so
-- positions become visible in order and a reader that has seen position N can never later find
-- an N - 1 it missed. A database sequence would not do: values taken at insert commit out of
-- order. Log lines (`log.*`) are not events of the history: they are read from the task's log.

-- The one counter: the last position given, and the last one pruned by retention (readers
-- asking to resume from before it are told 410 Gone).
CREATE TABLE event_positions (
    only_row        boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    last_given      bigint NOT NULL DEFAULT 0,
    pruned_through  bigint NOT NULL DEFAULT 0
);
INSERT INTO event_positions DEFAULT VALUES;

-- The event history: each event as it was published (its body carries `seq` too).
CREATE TABLE events (
    seq          bigint PRIMARY KEY,
    job_id       text NOT NULL,
    routing_key  text NOT NULL,
    body         jsonb NOT NULL,
    -- When the change it announces committed (the outbox row's creation).
    created_at   timestamptz NOT NULL,
    -- When it was numbered: grows with seq (numberings are serialized); retention goes by it.
    numbered_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX events_of_job ON events (job_id, seq);

-- The position of an `events` outbox row once numbered (a row published again after a failed
-- publish keeps its position).
ALTER TABLE outbox ADD COLUMN seq bigint;

-- The relay's one statement per batch: mark the rows the broker confirmed since the last call,
-- number the batch's unnumbered events (recording them in the history) and return the oldest
-- `lim` unpublished rows that may go out (work messages, numbered events), bodies as text,
-- events' bodies with their `seq`. Each statement of a
-- VOLATILE function reads a fresh snapshot: once the counter is locked, a numbering that
-- another relay committed meanwhile (two leaders for a moment) is seen and not done again.
CREATE FUNCTION outbox_batch(lim integer, confirmed bigint[])
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
            SELECT m.seq, split_part(m.routing_key, '.', 3), m.routing_key,
                   m.body || jsonb_build_object('seq', m.seq), m.created_at
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
        -- An event committed since the numbering above read the outbox waits for the next call
        -- (this statement reads a newer snapshot): no event goes out without its position. The
        -- relay calls again at once after a batch, else at its next poll (0.25-2 s).
        WHERE o.published_at IS NULL AND (o.seq IS NOT NULL OR o.exchange = 'work')
        ORDER BY o.id LIMIT lim;
END $$;
