-- The body of a `RunStage` work message (`host.<host>`), made by one function for the two
-- statements that claim tasks for their host and queue their work: the planning round's claim
-- of new tasks (`plan_repo.claim`: with the task's row as claimed, its job's row version and,
-- for a job's first input, the job's row) and the dispatcher's release of resting tasks
-- (`release_round`: without them). Inlined where it is called, as the events' functions (0052).
CREATE FUNCTION work_body_run_stage(
    job_id text, task_id text, stage text, claim uuid,
    claimed jsonb DEFAULT NULL, job_version bigint DEFAULT NULL, job jsonb DEFAULT NULL
) RETURNS jsonb LANGUAGE sql VOLATILE AS $$
    SELECT jsonb_build_object(
        'message_id', gen_random_uuid(), 'sent_at', event_time(now()), 'type', 'run_stage',
        'job_id', job_id, 'task_id', task_id, 'stage', stage, 'claim', claim)
        || CASE WHEN claimed IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('claimed', claimed, 'job_version', job_version, 'job', job)
           END
$$;
