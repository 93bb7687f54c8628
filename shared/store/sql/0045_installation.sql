-- The installation's identity: one row, made here, never changed. A host's claims of job uid
-- ranges name it (`shared/host/uid_ranges.py`), so a worker knows a range its own
-- installation holds from one another installation on that host holds.
CREATE TABLE installation (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    single boolean NOT NULL DEFAULT true UNIQUE CHECK (single),
    made_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO installation DEFAULT VALUES;
