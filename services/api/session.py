"""Signing in a browser: a session token kept in an HttpOnly cookie, for the dashboard.

Browsers cannot put a bearer header on `EventSource` or on a page load, so `POST /login` checks
the pasted token and stores a session token of its own (`users_repo.open_session`: it expires,
and `POST /logout` revokes it) in the `vigil_session` cookie (HttpOnly: scripts cannot read
it; SameSite=Strict: other sites' pages never send it). Every route accepts the cookie when
no `Authorization` header is given. A cookie-signed request that changes something must also
carry `X-Vigil-Request` (cross-site forms cannot set a header, and cross-site scripts need
CORS, which the api never grants): a second guard against cross-site request forgery.
"""

from typing import Final

from fastapi import HTTPException, Request, Response, status

COOKIE: Final = "vigil_session"
#: Header the dashboard's scripts send with every request that changes something.
FETCH_HEADER: Final = "X-Vigil-Request"
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


def token_of(request: Request, bearer: str | None) -> str | None:
    """The bearer token if given, else the session cookie's; None when neither.

    Raises 403 for a cookie-signed unsafe request without `X-Vigil-Request`.
    """
    if bearer:
        return bearer
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    if request.method not in _SAFE_METHODS and not request.headers.get(FETCH_HEADER):
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail=f"a request signed in by the dashboard cookie must carry the {FETCH_HEADER}"
            " header",
        )
    return token


def sign_in(response: Response, request: Request, token: str) -> None:
    """Set the session cookie (for this browser session only)."""
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )


def sign_out(response: Response) -> None:
    """Remove the session cookie."""
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from a page of another origin."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return origin == f"{request.url.scheme}://{request.url.netloc}"
