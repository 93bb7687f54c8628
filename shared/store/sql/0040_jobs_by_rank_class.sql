-- The quick planning round's read of each user's best-ranked jobs (`plan_repo._top_jobs`).
-- It sorted all of a user's active jobs by rank to probe the first
-- few: with 1,000 one-task jobs waiting, 1.05-1.5 ms a look, and a look per task's end on a
-- small pool. A rank is `priority + age_per_hour x hours since the job was made`: among the
-- jobs of one priority it orders them oldest first, whatever `age_per_hour`. So each
-- (owner, priority) class is read oldest first from this index, a few jobs each, and only
-- those are ranked. The classes themselves are found by a loose scan of the same index.
CREATE INDEX jobs_by_rank_class ON jobs (owner_id, priority, created_at, id)
    WHERE state IN ('active', 'configuring');
