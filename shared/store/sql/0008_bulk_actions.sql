-- Global fixes: one action applied to every task a selector matches, across jobs.
-- Every bulk action is recorded, dry runs too: who, when, what was selected and what it did.
-- The counts are written with each batch of tasks acted on, in the batch's transaction, so
-- the record always says what was committed; `finished_at` is null while (or if) it runs.

CREATE TABLE bulk_actions (
    id           bigserial PRIMARY KEY,
    actor_id     text NOT NULL REFERENCES users (id),
    actor        text NOT NULL,             -- the user's name when they acted
    role         text NOT NULL CHECK (role IN ('user', 'operator')),
    at           timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    action       text NOT NULL,
    selector     jsonb NOT NULL,            -- as given (a user's is also limited to their jobs)
    dry_run      boolean NOT NULL,
    matched      integer NOT NULL CHECK (matched >= 0),
    jobs         integer NOT NULL CHECK (jobs >= 0),
    applied      integer NOT NULL DEFAULT 0 CHECK (applied >= 0),
    refused      integer NOT NULL DEFAULT 0 CHECK (refused >= 0),
    refusals     jsonb NOT NULL DEFAULT '{}'  -- reason -> number of tasks refused for it
);
CREATE INDEX bulk_actions_actor ON bulk_actions (actor_id, id DESC);
