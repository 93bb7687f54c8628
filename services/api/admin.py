"""`python -m services.api.admin`: manage users and their bearer tokens (design §9).

    python -m services.api.admin create-user alice --role user      # prints alice's first token
    python -m services.api.admin create-token alice                 # prints one more token
    python -m services.api.admin list-users
    python -m services.api.admin list-tokens alice                  # ids, labels, revoked or not
    python -m services.api.admin revoke-token k-0123456789ab
    python -m services.api.admin disable-user alice                 # none of alice's tokens works

Operators do the same through the api (`/admin/users`, `/admin/tokens`) and `vigil users`.

The database is the one named by `VIGIL_DATABASE_URL`. A token is printed once and stored only
as its sha256 hash: it cannot be shown again, only replaced by a new one.
"""

import asyncio
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Annotated, TypeVar

import asyncpg
import typer
from pydantic import ValidationError

from shared.domain.errors import UNAVAILABLE, Conflict, NotFound, SchemaOutOfDate
from shared.runtime.config import CommonSettings
from shared.store import db, users_repo
from shared.store.db import Connection

T = TypeVar("T")

app = typer.Typer(
    help="Manage Vigil users and their tokens (VIGIL_DATABASE_URL names the database).",
    no_args_is_help=True,
    add_completion=False,
)


class RoleChoice(StrEnum):
    """What `--role` accepts."""

    USER = "user"
    OPERATOR = "operator"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=1)


def _run(action: Callable[[Connection], Awaitable[T]]) -> T:
    """Run `action` on a connection to the configured database; clear errors, exit code 1."""

    async def main(url: str) -> T:
        async with db.open_pool(url, min_size=1, max_size=1) as pool:
            await db.check_schema(pool)
            async with pool.acquire() as conn:
                return await action(conn)

    try:
        url = CommonSettings().database_url
    except ValidationError as exc:
        raise _fail(f"invalid settings: {exc}") from None
    try:
        return asyncio.run(main(url))
    except (Conflict, NotFound, SchemaOutOfDate, ValueError) as exc:
        raise _fail(str(exc)) from None
    except (*UNAVAILABLE, asyncpg.InterfaceError) as exc:
        raise _fail(f"cannot use the database at VIGIL_DATABASE_URL: {exc}") from None


@app.command("create-user")
def create_user(
    name: Annotated[str, typer.Argument(help="The new user's name.")],
    role: Annotated[RoleChoice, typer.Option(help="What the user may see and do.")],
) -> None:
    """Create a user and print their first token (it is not shown again)."""
    token = users_repo.new_token()

    async def create(conn: Connection) -> None:
        async with conn.transaction():
            await users_repo.create_user(conn, name, role.value)
            await users_repo.add_token(conn, name, token)

    _run(create)
    typer.echo(token)


@app.command("create-token")
def create_token(name: Annotated[str, typer.Argument(help="An existing user's name.")]) -> None:
    """Print a new token for an existing user (their other tokens stay valid)."""
    token = users_repo.new_token()

    async def add(conn: Connection) -> None:
        await users_repo.add_token(conn, name, token)

    _run(add)
    typer.echo(token)


@app.command("list-users")
def list_users() -> None:
    """Print every user: name, role, number of live tokens, creation time, disabled or not."""
    users = _run(users_repo.list_users)
    typer.echo(f"{'NAME':<32} {'ROLE':<9} {'TOKENS':>6}  CREATED")
    for found in users:
        created = found.created_at.isoformat(timespec="seconds")
        disabled = "  disabled" if found.disabled_at else ""
        typer.echo(
            f"{found.user.name:<32} {found.user.role:<9} {found.tokens:>6}  {created}{disabled}"
        )


@app.command("list-tokens")
def list_tokens(name: Annotated[str, typer.Argument(help="An existing user's name.")]) -> None:
    """Print a user's tokens: id, creation time, revoked or not, label (never the token)."""
    tokens = _run(lambda conn: users_repo.list_tokens(conn, name))
    for token in tokens:
        created = token.created_at.isoformat(timespec="seconds")
        state = "revoked" if token.revoked_at else "live"
        typer.echo(f"{token.id}  {created}  {state:<7}  {token.label or ''}")


@app.command("revoke-token")
def revoke_token(token_id: Annotated[str, typer.Argument(help="A token's id (k-...).")]) -> None:
    """Revoke a token: it stops working at once (open event streams within a second)."""
    token = _run(lambda conn: users_repo.revoke_token(conn, token_id))
    typer.echo(f"revoked {token.id} of {token.user}")


@app.command("disable-user")
def disable_user(name: Annotated[str, typer.Argument(help="An existing user's name.")]) -> None:
    """Disable a user: none of their tokens works any more (their jobs are left as they are)."""
    _run(lambda conn: users_repo.disable_user(conn, name))
    typer.echo(f"disabled {name}")


if __name__ == "__main__":
    app()
