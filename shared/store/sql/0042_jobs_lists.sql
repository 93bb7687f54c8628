-- The api's lists of jobs (`jobs_repo.list_jobs`: GET /jobs, `vigil list`, the dashboard),
-- newest first and paged by (created_at, id), by name or everyone's (an operator's): with an
-- index for neither, a page read the whole jobs table, history included (63 ms a
-- page of one name's jobs, 186 ms a page of everyone's, with 235,000 jobs; 0.6 and 0.14 ms
-- with these). An owner's page is read from either `jobs_owner` or `jobs_created`. Each
-- costs a submission about 3.5 us a job.
CREATE INDEX jobs_by_name ON jobs (name, created_at DESC, id DESC);
CREATE INDEX jobs_created ON jobs (created_at DESC, id DESC);
