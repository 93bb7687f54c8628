-- A resubmitted clone keeps its input's index: the index says which input a task
-- runs, the lineage (`resubmitted_from`, `superseded_by`) which try of it. `(job_id, index)`
-- was unique, so a clone took the next free index and the index no longer named the input.
-- Now two tasks share an index only along one lineage: the tasks that start one (appended,
-- duplicated, test runs: `resubmitted_from` null, equal to one another here) each have an
-- index of their own, and each task is cloned at most once under its index. Its leading
-- `(job_id, index)` serves what the old key served: a job's tasks by index, the finaliser's
-- probes. Tasks cloned before this migration keep the index they were given.
ALTER TABLE tasks DROP CONSTRAINT tasks_job_id_index_key;
ALTER TABLE tasks ADD CONSTRAINT tasks_job_id_index_lineage_key
    UNIQUE NULLS NOT DISTINCT (job_id, index, resubmitted_from);
