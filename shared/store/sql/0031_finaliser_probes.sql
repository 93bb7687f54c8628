-- The finaliser's probes stay probes. `end_finished_jobs` (0029) makes its plans
-- once per connection (a custom plan of its last statement cost more than running it), and a
-- plan made while the tables were young (a fresh database, or one that autovacuum does not
-- analyse) read every task and every active job at each call: 1 ms a call after 1,000 jobs,
-- growing with the history. Now a job is found by its id (`jobs_pkey`: its state is compared
-- as text, which the partial index `jobs_active` cannot answer, so a plan never scans that
-- index through), and without sequential scans a job's tasks are probed through
-- `tasks_unfinished` and `tasks_job_id_index_key`. Otherwise as in 0029.
CREATE OR REPLACE FUNCTION end_finished_jobs(ids text[])
RETURNS TABLE (id text, state text, skipped boolean)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    mine text[];
BEGIN
    SELECT coalesce(array_agg(l.id), '{}') INTO mine FROM (
        SELECT j.id FROM jobs j WHERE j.id = ANY(ids) AND j.state::text = 'active'
        ORDER BY j.id FOR UPDATE SKIP LOCKED) l;
    RETURN QUERY
        SELECT j.id, NULL::text, true FROM jobs j
        WHERE j.id = ANY(ids) AND j.state::text = 'active' AND NOT j.id = ANY(mine);
    RETURN QUERY
        WITH done AS MATERIALIZED (
            SELECT j.id FROM jobs j
            WHERE j.id = ANY(mine) AND j.state::text = 'active' AND NOT EXISTS (
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
            FROM outcome o WHERE j.id = o.id AND j.state::text = 'active'
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
