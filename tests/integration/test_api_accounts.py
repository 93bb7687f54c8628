"""`/admin/users` and `/admin/tokens`: operators make, list, revoke and disable; a token is
shown once, and a revoked one (or a disabled user's) stops working at the next request."""

import uuid
from collections.abc import AsyncIterator

import pytest

from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_user_made_by_an_operator_works_until_their_token_is_revoked(api: Api) -> None:
    ops = api.operator.headers
    name = f"bob-{uuid.uuid4().hex[:8]}"

    # when an operator creates a user, then gives them a second token
    made = await api.client.post(
        "/admin/users", json={"name": name, "label": "laptop"}, headers=ops
    )
    second = await api.client.post(f"/admin/users/{name}/tokens", json={}, headers=ops)

    # then both tokens work, and the listing shows ids and labels, never a token
    assert (made.status_code, second.status_code) == (201, 201), made.text
    first_token, second_token = made.json()["token"], second.json()["token"]
    for token in (first_token, second_token):
        assert (await api.client.get("/jobs", headers=_bearer(token))).status_code == 200
    listed = (await api.client.get(f"/admin/users/{name}/tokens", headers=ops)).json()
    assert [(t["label"], t["revoked_at"]) for t in listed] == [("laptop", None), (None, None)]
    assert first_token not in str(listed) and second_token not in str(listed)
    users = (await api.client.get("/admin/users", headers=ops)).json()
    assert [(u["role"], u["tokens"]) for u in users if u["name"] == name] == [("user", 2)]

    # when the first token is revoked (twice: idempotent)
    token_id = made.json()["details"]["id"]
    revoked = await api.client.delete(f"/admin/tokens/{token_id}", headers=ops)
    again = await api.client.delete(f"/admin/tokens/{token_id}", headers=ops)

    # then it no longer works, the other still does
    assert revoked.status_code == again.status_code == 200
    assert revoked.json()["revoked_at"] == again.json()["revoked_at"] is not None
    assert (await api.client.get("/jobs", headers=_bearer(first_token))).status_code == 401
    assert (await api.client.get("/jobs", headers=_bearer(second_token))).status_code == 200

    # and when the user is disabled, none works
    disabled = await api.client.post(f"/admin/users/{name}/disable", headers=ops)
    assert disabled.status_code == 200 and disabled.json()["disabled_at"] is not None
    assert (await api.client.get("/jobs", headers=_bearer(second_token))).status_code == 401


async def test_accounts_are_for_operators_only(api: Api) -> None:
    name = api.other.user.name
    calls = [
        ("GET", "/admin/users", None),
        ("POST", "/admin/users", {"name": f"eve-{uuid.uuid4().hex[:8]}"}),
        ("GET", f"/admin/users/{name}/tokens", None),
        ("POST", f"/admin/users/{name}/tokens", {}),
        ("POST", f"/admin/users/{name}/disable", None),
        ("DELETE", "/admin/tokens/k-0123456789ab", None),
    ]
    for method, path, body in calls:
        answer = await api.client.request(method, path, json=body, headers=api.user.headers)
        assert answer.status_code == 403, (method, path, answer.text)
    assert (await api.client.get("/jobs", headers=api.other.headers)).status_code == 200


async def test_bad_account_requests_say_what_is_wrong(api: Api) -> None:
    ops = api.operator.headers
    taken = await api.client.post("/admin/users", json={"name": api.user.user.name}, headers=ops)
    bad_name = await api.client.post("/admin/users", json={"name": "../root"}, headers=ops)
    bad_role = await api.client.post(
        "/admin/users", json={"name": "carol-x", "role": "root"}, headers=ops
    )
    no_user = await api.client.post("/admin/users/nobody-here/tokens", json={}, headers=ops)
    no_token = await api.client.delete("/admin/tokens/k-0123456789ab", headers=ops)
    bad_token = await api.client.delete("/admin/tokens/not-a-token-id", headers=ops)
    myself = await api.client.post(f"/admin/users/{api.operator.user.name}/disable", headers=ops)
    assert taken.status_code == 409 and "already exists" in taken.text
    assert (bad_name.status_code, bad_role.status_code) == (422, 422)
    assert no_user.status_code == 404 and "no user named" in no_user.text
    assert no_token.status_code == 404 and "no token" in no_token.text
    assert bad_token.status_code == 422
    assert myself.status_code == 409 and "cannot disable themselves" in myself.text
