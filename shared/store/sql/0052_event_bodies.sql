-- The body of every event the outbox holds is made by one function per event type, here: the
-- repositories' statements (one event or a set of them, in the statement of their change) and
-- the functions of the schema (`end_finished_jobs`) all call them, so no type is written out
-- twice. The pydantic models of `shared/domain/messages.py` read them (`decode`), and
-- `tests/integration/test_event_bodies.py` holds each function to its model and to the fields
-- docs/reference/events.md promises a subscriber. Each is one SQL expression, inlined by the
-- planner where it is called: a body costs what the `jsonb_build_object` it replaces cost.
-- The relay adds the event's position (`seq`) as it numbers it (`outbox_batch`).

-- A time as an event carries it: ISO 8601 in UTC, `Z`, to the microsecond, whatever the
-- session's time zone.
CREATE FUNCTION event_time(ts timestamptz) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- `task.<state>.<job>`: a task entered `state` (`TaskEvent`).
CREATE FUNCTION event_body_task(
    job_id text, task_id text, state task_state, previous task_state DEFAULT NULL,
    run_number integer DEFAULT 1, host text DEFAULT NULL,
    failure_class failure_class DEFAULT NULL, exit_code integer DEFAULT NULL,
    signal integer DEFAULT NULL, error_brief text DEFAULT NULL
) RETURNS jsonb LANGUAGE sql VOLATILE AS $$
    SELECT jsonb_build_object(
        'message_id', gen_random_uuid(), 'sent_at', event_time(now()), 'type', 'task_event',
        'job_id', job_id, 'task_id', task_id, 'state', state, 'previous', previous,
        'run_number', run_number, 'host', host, 'failure_class', failure_class,
        'exit_code', exit_code, 'signal', signal, 'error_brief', error_brief)
$$;

-- `task.<verdict>.<job>`: the triage's decision about a failed task (`TaskDecision`).
CREATE FUNCTION event_body_task_decision(
    job_id text, task_id text, verdict text, reason text,
    failure_class failure_class DEFAULT NULL
) RETURNS jsonb LANGUAGE sql VOLATILE AS $$
    SELECT jsonb_build_object(
        'message_id', gen_random_uuid(), 'sent_at', event_time(now()), 'type', 'task_decision',
        'job_id', job_id, 'task_id', task_id, 'verdict', verdict, 'reason', reason,
        'failure_class', failure_class)
$$;

-- `job.<outcome>.<job>`: a job's outcome (`JobEvent`); `task_id` the task that caused it, if
-- one did.
CREATE FUNCTION event_body_job(
    job_id text, outcome text, task_id text DEFAULT NULL, brief text DEFAULT NULL
) RETURNS jsonb LANGUAGE sql VOLATILE AS $$
    SELECT jsonb_build_object(
        'message_id', gen_random_uuid(), 'sent_at', event_time(now()), 'type', 'job_event',
        'job_id', job_id, 'outcome', outcome, 'task_id', task_id, 'brief', brief)
$$;

-- `host.<state>.<host>`: a host's quarantine changed, or an operator removed it (`HostEvent`).
CREATE FUNCTION event_body_host(
    host text, state text, reason text DEFAULT NULL, until timestamptz DEFAULT NULL,
    "by" text DEFAULT 'breaker'
) RETURNS jsonb LANGUAGE sql VOLATILE AS $$
    SELECT jsonb_build_object(
        'message_id', gen_random_uuid(), 'sent_at', event_time(now()), 'type', 'host_event',
        'host', host, 'state', state, 'reason', reason, 'until', event_time(until),
        'by', "by")
$$;

-- The finaliser's function, its `job.<outcome>` events made by `event_body_job`; otherwise as
-- in 0033.
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
                      'failed_post_processing_prerequisites'))
                OFFSET 0)  -- a subplan: the probe of this job's tasks (see 0033)
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
            SELECT 'events', 'job.' || e.outcome || '.' || m.id,
                event_body_job(job_id => m.id, outcome => e.outcome, brief => 'job ' || m.state)
            FROM moved m
            CROSS JOIN LATERAL (SELECT CASE WHEN m.state = 'completed' THEN 'succeeded'
                                            ELSE 'failed' END AS outcome) e
            ORDER BY m.id
            RETURNING 1
        )
        SELECT m.id, m.state, false FROM moved m;
END $$;
