"""Users and tokens (operators): `users` (and `users share`, `users quota`), `add-user`,
`tokens`, `new-token`, `revoke-token`, `disable-user`."""

import math
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer

from vigil import pool, render, sizes
from vigil.cli.base import JsonFlag, command, out, print_json, session
from vigil.errors import UsageError

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


class UserVerb(StrEnum):
    """What `vigil users VERB NAME VALUE` does to a user (operators only)."""

    SHARE = "share"  # the user's fair share of the pool (default 1)
    QUOTA = "quota"  # the user's quota of stored bytes (default VIGIL_STORE_QUOTA_BYTES)


@command()
def users(
    ctx: typer.Context,
    verb: Annotated[
        UserVerb | None,
        typer.Argument(
            metavar="share|quota",
            help="share NAME X: set NAME's share. quota NAME SIZE: set NAME's quota.",
        ),
    ] = None,
    name: Annotated[str | None, typer.Argument(metavar="NAME", help="The user's name.")] = None,
    value: Annotated[
        str | None,
        typer.Argument(
            metavar="X",
            help="share: the user's share (> 0). quota: bytes (10G, 500MiB, 2TB), 'none' (no"
            " quota) or 'default' (the installation's).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the users; or set one's fair share, `users share NAME X`, or quota of stored
    bytes, `users quota NAME SIZE` (operators).

    The list: role, fair share, decayed usage (CPU-seconds), stored bytes and quota, live
    tokens, disabled. A share is a weight: `vigil users share bob 2` gives bob's waiting work
    twice the pool of a user of share 1 (the default) when both wait. A quota bounds the
    bytes a user keeps in the object store (their tasks' outputs and uploads, until purged):
    `vigil users quota bob 500G`; `none` lifts it, `default` gives back the installation's
    (VIGIL_STORE_QUOTA_BYTES)."""
    if verb is None:
        with session(ctx).client() as client:
            found = client.users()
        if as_json:
            print_json(found)
        else:
            out.print(render.users_table(found))
        return
    if name is None or value is None:
        wanted = "a number X" if verb is UserVerb.SHARE else "a SIZE"
        raise UsageError(f"vigil users {verb.value} needs a NAME and {wanted}")
    with session(ctx).client() as client:
        if verb is UserVerb.SHARE:
            user = client.set_share(name, _share(value))
        else:
            user = client.set_store_quota(name, _quota(value))
    if as_json:
        print_json(user)
    elif verb is UserVerb.SHARE:
        share = pool.number(user.get("share"))
        print(render.printable(f"user {user.get('name', name)}: share {share}"))
    else:
        print(render.printable(f"user {user.get('name', name)}: {render.quota_text(user)}"))


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"a share is a number above 0, not {text[:40]!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise UsageError(f"a share is a number above 0, not {value:g}")
    return value


def _quota(text: str) -> int | None:
    """A quota as the API takes it: bytes, 0 for none, None for the installation's."""
    word = text.strip().lower()
    if word == "default":
        return None
    if word in ("none", "unlimited"):
        return 0
    try:
        return sizes.parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{exc}; or 'none', or 'default'") from None


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
