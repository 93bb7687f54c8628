-- The dispatcher releases tasks of active and configuring jobs: with `jobs_active`, this lets
-- it read only those jobs (a BitmapOr of the two), never the whole history. A migration of its
-- own, since a new enum value ('configuring', 0007) cannot be used in the transaction adding it.
CREATE INDEX jobs_configuring ON jobs (created_at) WHERE state = 'configuring';
