-- The bytes each user keeps in the object store, against their quota (shared/store/quota_repo.py):
-- a counter kept in the transactions that store or give back bytes, so that no check sums a
-- user's outputs: a task's completion adds its outputs' bytes, an upload handed out its size,
-- a purge gives its job's outputs back.
ALTER TABLE users
    ADD COLUMN stored_bytes bigint NOT NULL DEFAULT 0,
    -- null: the installation's default (VIGIL_STORE_QUOTA_BYTES); 0: no quota
    ADD COLUMN store_quota_bytes bigint CHECK (store_quota_bytes >= 0);

-- The files a user uploaded (POST /uploads), by their sha256: counted once each.
CREATE TABLE uploads (
    user_id     text NOT NULL REFERENCES users (id),
    sha256      text NOT NULL,
    size        bigint NOT NULL CHECK (size >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, sha256)
);

-- What is stored already: the outputs of the jobs not purged (uploads were not recorded).
UPDATE users u SET stored_bytes = s.bytes
FROM (
    SELECT j.owner_id, sum(o.size) AS bytes
    FROM task_outputs o JOIN tasks t ON t.id = o.task_id JOIN jobs j ON j.id = t.job_id
    WHERE o.object_key IS NOT NULL AND j.purged_at IS NULL
    GROUP BY j.owner_id
) s
WHERE u.id = s.owner_id;
