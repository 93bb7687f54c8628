"""The SigV4 query signer of the store's signer (`shared/objects/presign.py`), held to AWS's
published example ("Authenticating Requests: Using Query Parameters")."""

from datetime import UTC, datetime

import pytest

from shared.objects.presign import Credentials, Presigner

EXAMPLE = Presigner(
    "examplebucket",
    Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    "us-east-1",
)


def test_a_get_is_signed_as_in_aws_example() -> None:
    url = EXAMPLE.sign("GET", "test.txt", 86400, now=datetime(2013, 5, 24, tzinfo=UTC))

    assert url.startswith("https://examplebucket.s3.amazonaws.com/test.txt?")
    assert url.endswith(
        "X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )


def test_signed_headers_and_a_sub_resource_change_the_signature() -> None:
    at = datetime(2013, 5, 24, tzinfo=UTC)
    plain = EXAMPLE.sign("PUT", "a/b", 60, now=at)
    guarded = EXAMPLE.sign("PUT", "a/b", 60, headers={"If-None-Match": "*"}, now=at)
    part = EXAMPLE.sign("PUT", "a/b", 60, query={"partNumber": "1", "uploadId": "u"}, now=at)

    assert "X-Amz-SignedHeaders=host%3Bif-none-match" in guarded
    assert "partNumber=1" in part and "uploadId=u" in part
    assert len({plain.rsplit("=", 1)[1], guarded.rsplit("=", 1)[1], part.rsplit("=", 1)[1]}) == 3


def test_a_link_lasts_at_most_a_week_and_a_secret_is_never_shown() -> None:
    with pytest.raises(ValueError, match="1 to 604800"):
        EXAMPLE.sign("GET", "k", 604801)
    assert "EXAMPLEKEY" not in repr(EXAMPLE)
