-- Tokens and users an operator can end. A token gets a public id (`k-`
-- and the first 12 hex digits of its hash: never the token itself) by which it is listed and
-- revoked, an optional label, and `revoked_at`; a user gets `disabled_at`. A revoked token or
-- a disabled user's tokens stop working at the next request (every request looks its token
-- up) and within a second on an open event stream (it looks again every second). The
-- dashboard's sign-in makes a token of its own (`session`, with `expires_at`) for the cookie,
-- which signing out revokes: the token pasted into the form never lives in a cookie.
ALTER TABLE tokens ADD COLUMN id text UNIQUE, ADD COLUMN label text,
    ADD COLUMN revoked_at timestamptz, ADD COLUMN session boolean NOT NULL DEFAULT false,
    ADD COLUMN expires_at timestamptz;
UPDATE tokens SET id = 'k-' || substr(token_hash, 1, 12);
ALTER TABLE tokens ALTER COLUMN id SET NOT NULL;
ALTER TABLE users ADD COLUMN disabled_at timestamptz;
