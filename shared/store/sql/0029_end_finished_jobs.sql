-- Ending the jobs a task's end may have finished, in one round trip: the
-- finaliser's transaction was five (BEGIN, the lock, the counts, the move with its events,
-- COMMIT). Each statement of a VOLATILE function takes a snapshot of its own, so the counts
-- still see whatever committed before the lock was granted (whoever adds work to a job locks
-- its row first: `jobs_repo.end_finished`).
--
-- end_finished_jobs(ids): of the jobs `ids`, those still active whose tasks are all
-- terminal and decided (the index `tasks_unfinished` finds the others) move to `completed`
-- when every task that decides the outcome completed (one superseded by its resubmitted clone
-- does not decide; a job with none is not finished), else to `failed`, each with its
-- `job.succeeded` / `job.failed` event in the outbox, as `jobs_repo.outcome_event` writes it
-- (`tests/integration/test_finaliser.py` reads it back through the model). Returned: each job
-- ended with its state, and each active one whose row someone held (`skipped`: look again).
CREATE FUNCTION end_finished_jobs(ids text[])
RETURNS TABLE (id text, state text, skipped boolean)
-- Its statements' plans are made once per connection, not at every call (a custom plan of
-- the last one cost more than running it).
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    mine text[];
BEGIN
    SELECT coalesce(array_agg(l.id), '{}') INTO mine FROM (
        SELECT j.id FROM jobs j WHERE j.id = ANY(ids) AND j.state = 'active'
        ORDER BY j.id FOR UPDATE SKIP LOCKED) l;
    RETURN QUERY
        SELECT j.id, NULL::text, true FROM jobs j
        WHERE j.id = ANY(ids) AND j.state = 'active' AND NOT j.id = ANY(mine);
    RETURN QUERY
        WITH done AS MATERIALIZED (
            SELECT j.id FROM jobs j
            WHERE j.id = ANY(mine) AND j.state = 'active' AND NOT EXISTS (
                SELECT 1 FROM tasks t WHERE t.job_id = j.id AND NOT t.test
                  AND (NOT t.decided OR t.state NOT IN (
                      'completed', 'terminated', 'failed_to_setup', 'failed_on_cluster',
                      'failed_to_post_process', 'failed_setup_prerequisites',
                      'failed_post_processing_prerequisites')))
        ), outcome AS (  -- a probe of the job's tasks each (a join would scan them all)
            SELECT d.id, CASE WHEN c.other = 0 THEN 'completed' ELSE 'failed' END AS state
            FROM done d CROSS JOIN LATERAL (
                SELECT count(*) AS n, count(*) FILTER (WHERE t.state <> 'completed') AS other
                FROM tasks t WHERE t.job_id = d.id AND t.superseded_by IS NULL AND NOT t.test
            ) c
            WHERE c.n > 0
        ), moved AS (
            UPDATE jobs j SET state = o.state::job_state, finished_at = now()
            FROM outcome o WHERE j.id = o.id AND j.state = 'active'
            RETURNING j.id, o.state
        ), evented AS (
            INSERT INTO outbox (exchange, routing_key, body)
            SELECT 'events', 'job.' || e.outcome || '.' || m.id, jsonb_build_object(
                'message_id', gen_random_uuid(), 'sent_at', now(), 'type', 'job_event',
                'job_id', m.id, 'outcome', e.outcome, 'task_id', NULL,
                'brief', 'job ' || m.state)
            FROM moved m
            CROSS JOIN LATERAL (SELECT CASE WHEN m.state = 'completed' THEN 'succeeded'
                                            ELSE 'failed' END AS outcome) e
            ORDER BY m.id
            RETURNING 1
        )
        SELECT m.id, m.state, false FROM moved m;
END $$;
