-- What the relay published, counted per minute (the dashboard's charts read a
-- few hundred rows here instead of the event history): per job (`job_id`), and for the whole
-- system (`job_id` = ''). Kinds: `state:<task state>` (tasks that reached on_cpu or an end),
-- `started` (a command started: on_cpu), `ended` (a task came to rest), `failed:<class>`.
-- Written by the leading scheduler every few seconds, in one statement; pruned with the event
-- history.
CREATE TABLE activity (
    job_id  text NOT NULL,
    minute  timestamptz NOT NULL,
    kind    text NOT NULL,
    n       bigint NOT NULL,
    PRIMARY KEY (job_id, minute, kind)
);
