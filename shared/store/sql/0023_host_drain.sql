-- Draining a host: an operator's planned stop. A draining host finishes
-- the tasks it holds (their later stages come through its host queue) and takes no new one
-- from its pool, until it is undrained. Not a quarantine: nothing is wrong with it.
ALTER TABLE hosts ADD COLUMN draining boolean NOT NULL DEFAULT false;
