-- Emergency stops (design §8, §9 `POST /admin/emergency-stop`): who stopped everything, when
-- and why, who resumed, and exactly which jobs and tasks the stop touched, so that a resume
-- undoes the stop and nothing else.

CREATE TABLE emergency_stops (
    id          bigserial PRIMARY KEY,
    stopped_by  text NOT NULL,
    stopped_at  timestamptz NOT NULL DEFAULT now(),
    reason      text NOT NULL,
    resumed_by  text,
    resumed_at  timestamptz,
    CHECK ((resumed_by IS NULL) = (resumed_at IS NULL))
);
-- At most one stop in force at a time.
CREATE UNIQUE INDEX emergency_stops_in_force ON emergency_stops ((true)) WHERE resumed_at IS NULL;

-- Jobs the stop suspended (active then), and jobs submitted while it was in force.
CREATE TABLE emergency_stop_jobs (
    stop_id  bigint NOT NULL REFERENCES emergency_stops (id),
    job_id   text NOT NULL REFERENCES jobs (id),
    PRIMARY KEY (stop_id, job_id)
);

-- Tasks whose running command the stop killed (on_cpu -> failed_on_cluster, class cancelled).
CREATE TABLE emergency_stop_tasks (
    stop_id  bigint NOT NULL REFERENCES emergency_stops (id),
    task_id  text NOT NULL REFERENCES tasks (id),
    PRIMARY KEY (stop_id, task_id)
);
