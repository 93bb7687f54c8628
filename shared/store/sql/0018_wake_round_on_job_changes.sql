-- The scheduling round sleeps longer when nothing happens (idle services), woken by
-- the outbox's notifications. Changes that make tasks releasable without an outbox row wake it
-- too: a job that becomes active (resumed, by hand or when an emergency stop is lifted;
-- reopened), a throttle that changes, an emergency stop lifted (a configuring job's test
-- tasks), a claim given back by a worker (its own statement notifies: services/worker/claims.py).
CREATE FUNCTION wake_round() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('vigil_outbox', 'round');
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_wake_round AFTER UPDATE ON jobs FOR EACH ROW
    WHEN ((NEW.state = 'active' AND OLD.state <> 'active')
          OR NEW.max_in_flight IS DISTINCT FROM OLD.max_in_flight
          OR NEW.release_per_tick IS DISTINCT FROM OLD.release_per_tick)
    EXECUTE FUNCTION wake_round();

CREATE TRIGGER emergency_stops_wake_round AFTER UPDATE ON emergency_stops FOR EACH ROW
    WHEN (NEW.resumed_at IS NOT NULL AND OLD.resumed_at IS NULL)
    EXECUTE FUNCTION wake_round();
