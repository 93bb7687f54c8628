"""Users and tokens (operators): `users`, `add-user`, `tokens`, `new-token`, `revoke-token`,
`disable-user`."""

import sys
from typing import Annotated, Any

import typer

from vigil import render
from vigil.cli.base import JsonFlag, command, out, print_json, session

# -- accounts (operators) ---------------------------------------------------------------------


def _issued(issued: dict[str, Any]) -> None:
    """A token just made: alone on stdout (`TOKEN=$(vigil add-user bob)`), its id on stderr."""
    details = issued.get("details") or {}
    print(
        f"token {render.printable(details.get('id'))} for {render.printable(details.get('user'))}"
        " (shown once: keep it now)",
        file=sys.stderr,
    )
    print(issued["token"])


@command()
def users(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the users: role, live tokens, disabled (operators)."""
    with session(ctx).client() as client:
        found = client.users()
    if as_json:
        print_json(found)
    else:
        out.print(render.users_table(found))


@command("add-user")
def add_user(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The new user's name.")],
    operator: Annotated[bool, typer.Option("--operator", help="An operator, not a user.")] = False,
    label: Annotated[str | None, typer.Option(help="What the first token is for.")] = None,
) -> None:
    """Create a user and print their first token (operators)."""
    with session(ctx).client() as client:
        _issued(client.add_user(name, "operator" if operator else "user", label))


@command()
def tokens(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A user's name.")],
    as_json: JsonFlag = False,
) -> None:
    """List a user's tokens by id, revoked ones included (operators)."""
    with session(ctx).client() as client:
        found = client.tokens(name)
    if as_json:
        print_json(found)
    else:
        out.print(render.tokens_table(found))


@command("new-token")
def new_token(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A user's name.")],
    label: Annotated[str | None, typer.Option(help="What the token is for.")] = None,
) -> None:
    """Print one more token for a user (operators)."""
    with session(ctx).client() as client:
        _issued(client.new_token(name, label))


@command("revoke-token")
def revoke_token(
    ctx: typer.Context, token_id: Annotated[str, typer.Argument(metavar="TOKEN_ID")]
) -> None:
    """Revoke a token by its id (k-...): it stops working at once (operators)."""
    with session(ctx).client() as client:
        token = client.revoke_token(token_id)
    print(f"revoked {render.printable(token.get('id'))} of {render.printable(token.get('user'))}")


@command("disable-user")
def disable_user(ctx: typer.Context, name: Annotated[str, typer.Argument()]) -> None:
    """Disable a user: none of their tokens works any more (operators)."""
    with session(ctx).client() as client:
        client.disable_user(name)
    print(f"disabled {render.printable(name)}")
