-- Jobs run as an unprivileged Unix user of their owner's own: uid and gid
-- `VIGIL_JOB_UID_BASE` + `users.job_uid`, numeric (no account is created on the hosts). Two
-- users' jobs never share a uid, so one cannot read the other's work dirs or processes.
CREATE SEQUENCE users_job_uid_seq MINVALUE 1 MAXVALUE 999999;
ALTER TABLE users ADD COLUMN job_uid integer NOT NULL DEFAULT nextval('users_job_uid_seq')
    UNIQUE CHECK (job_uid BETWEEN 1 AND 999999);
ALTER SEQUENCE users_job_uid_seq OWNED BY users.job_uid;
