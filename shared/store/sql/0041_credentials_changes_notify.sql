-- The api remembers, for a few seconds, whom a token belongs to (`services/api/credentials.py`):
-- one statement fewer a request. What could make it wrong
-- tells every api at once: a token revoked, expired early, deleted or moved to another
-- user, a user disabled, deleted or given another role or name. A notification on the
-- channel `vigil_credentials` empties every api's memory of tokens (they are rare changes;
-- the fair share's updates of `users.usage` are not among them).
CREATE FUNCTION credentials_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('vigil_credentials', '');
    RETURN NULL;
END $$;

CREATE TRIGGER tokens_changed AFTER UPDATE OR DELETE OR TRUNCATE ON tokens
    FOR EACH STATEMENT EXECUTE FUNCTION credentials_changed();

CREATE TRIGGER users_changed AFTER UPDATE OF id, name, role, disabled_at ON users
    FOR EACH ROW
    WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.name IS DISTINCT FROM NEW.name
          OR OLD.role IS DISTINCT FROM NEW.role OR OLD.disabled_at IS DISTINCT FROM NEW.disabled_at)
    EXECUTE FUNCTION credentials_changed();

CREATE TRIGGER users_gone AFTER DELETE OR TRUNCATE ON users
    FOR EACH STATEMENT EXECUTE FUNCTION credentials_changed();
