-- Kills owed. An attempt closed by someone who is not its command's
-- parent (a cancel, a task declared lost, a worker failing while it drove the task) leaves
-- `reaped_at` empty until the command is known gone; the kill order sent with most of those
-- changes (`KillTask`) could be lost for good (dead-lettered), and then nothing killed the
-- command, or recorded it gone, so a lost task waited for its fence for ever. Each host's
-- supervisor now reads those attempts of its host at every reconcile, kills what of them still
-- runs and records `reaped_at` (services/supervisor/owed_kills.py). The index holds only them:
-- the read costs nothing whatever the history of attempts. The classes are
-- `attempts_repo.KILL_OWED_CLASSES`.
CREATE INDEX attempts_kill_owed ON attempts (host)
    WHERE pid IS NOT NULL AND reaped_at IS NULL AND ended_at IS NOT NULL
      AND failure_class IN ('cancelled', 'lost', 'hook', 'host', 'platform');
