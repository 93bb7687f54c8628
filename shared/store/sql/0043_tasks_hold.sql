-- What a task holds on its host while in flight, and for whom: its job's request and owner,
-- copied by the planning round's claim (`plan_repo._CLAIM`), so that the round's sums of what
-- the tasks in flight hold, per host and per owner (`pool_repo.HELD_BY_HOST_AND_OWNER`), read
-- the tasks alone instead of looking each one's job up (40 ms a look with 16,000
-- tasks in flight on 1,000 hosts, 85 ms where they are 16,000 one-task jobs). A job's request
-- changes only while it is configuring; a task holds what it was placed with. NULL: claimed
-- before this migration, or never by the round: its job is looked up, as before.
ALTER TABLE tasks
    ADD COLUMN hold_owner text,
    ADD COLUMN hold_millicpus integer,
    ADD COLUMN hold_memory_mb integer,
    ADD COLUMN hold_gpus integer;

-- The tasks in flight that hold what their jobs say (claimed before this migration, or put
-- in flight by other means): the few whose jobs the sums look up.
CREATE INDEX tasks_in_flight_unheld ON tasks (job_id)
    WHERE hold_owner IS NULL AND (claim IS NOT NULL OR state NOT IN (
        'new', 'on_hold', 'completed', 'terminated', 'failed_to_setup', 'failed_on_cluster',
        'failed_to_post_process', 'failed_setup_prerequisites',
        'failed_post_processing_prerequisites'));
