"""S3 links signed for one request each: AWS Signature Version 4 in the query string.

The control plane holds the store's credentials and signs, for a host, the one request it may
make (`services/scheduler/signer.py`); the host sends it as signed, with the headers the
signature covers, and holds no credential. obstore signs a plain GET or PUT of a key only;
a multipart upload's requests (`?uploads`, `?partNumber=N&uploadId=U`, `?uploadId=U`) and
headers that must be signed (`If-None-Match`, `x-amz-meta-sha256`) need this. It follows AWS's
"Authenticating Requests: Using Query Parameters" (the test checks its published example).
"""

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from urllib.parse import quote, urlsplit

ALGORITHM: Final = "AWS4-HMAC-SHA256"
#: The longest a SigV4 link may be good for.
MAX_EXPIRES_S: Final = 7 * 86400


@dataclass(frozen=True)
class Credentials:
    """An S3 access key, its secret, and a session token when the key is a temporary one."""

    access_key: str
    secret_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # never a secret in a log or a traceback
        return f"Credentials(access_key={self.access_key!r})"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "Credentials":
        """The standard `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and
        `AWS_SESSION_TOKEN`); ValueError naming what is missing."""
        env = os.environ if environ is None else environ
        missing = [n for n in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not env.get(n)]
        if missing:
            raise ValueError(f"the S3 store's signer needs {' and '.join(missing)}")
        return cls(
            env["AWS_ACCESS_KEY_ID"],
            env["AWS_SECRET_ACCESS_KEY"],
            env.get("AWS_SESSION_TOKEN") or None,
        )


def region_from_environment(environ: Mapping[str, str] | None = None) -> str:
    """`AWS_REGION` (or `AWS_DEFAULT_REGION`), else `us-east-1`."""
    env = os.environ if environ is None else environ
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"


@dataclass(frozen=True)
class Presigner:
    """Signs requests on the objects of `bucket` at `endpoint_url` (path-style: a server
    other than AWS), or at AWS's virtual-hosted `https://BUCKET.s3.REGION.amazonaws.com`
    (`s3.amazonaws.com` in `us-east-1`)."""

    bucket: str
    credentials: Credentials
    region: str = "us-east-1"
    endpoint_url: str = ""

    def object_url(self, key: str) -> str:
        """The unsigned URL of the object at `key` (the full key, with any prefix)."""
        path = quote(key, safe="/~")
        if self.endpoint_url:
            return f"{self.endpoint_url.rstrip('/')}/{quote(self.bucket, safe='~')}/{path}"
        regional = "" if self.region == "us-east-1" else f".{self.region}"
        return f"https://{self.bucket}.s3{regional}.amazonaws.com/{path}"

    def sign(
        self,
        method: str,
        key: str,
        expires_s: int,
        *,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        now: datetime | None = None,
    ) -> str:
        """A URL good for `expires_s` seconds for one `method` request on `key`, with the
        sub-resource `query` (`{"uploads": ""}`, `{"partNumber": "1", "uploadId": ...}`); the
        request must carry exactly `headers` (names in lower case), which the signature covers.
        The payload is not signed (`UNSIGNED-PAYLOAD`): the object's sha256 is checked by the
        writer, and its metadata signed."""
        if not 0 < expires_s <= MAX_EXPIRES_S:
            raise ValueError(f"a signed link lasts 1 to {MAX_EXPIRES_S} s, not {expires_s}")
        at = (now or datetime.now(UTC)).astimezone(UTC)
        stamp, day = at.strftime("%Y%m%dT%H%M%SZ"), at.strftime("%Y%m%d")
        url = self.object_url(key)
        parts = urlsplit(url)
        signed = {
            "host": parts.netloc,
            **{k.lower(): v.strip() for k, v in (headers or {}).items()},
        }
        names = ";".join(sorted(signed))
        scope = f"{day}/{self.region}/s3/aws4_request"
        params = {
            **(query or {}),
            "X-Amz-Algorithm": ALGORITHM,
            "X-Amz-Credential": f"{self.credentials.access_key}/{scope}",
            "X-Amz-Date": stamp,
            "X-Amz-Expires": str(expires_s),
            "X-Amz-SignedHeaders": names,
        }
        if self.credentials.session_token:
            params["X-Amz-Security-Token"] = self.credentials.session_token
        canonical_query = "&".join(f"{_encode(k)}={_encode(v)}" for k, v in sorted(params.items()))
        canonical = "\n".join(
            (
                method,
                parts.path,
                canonical_query,
                "".join(f"{k}:{signed[k]}\n" for k in sorted(signed)),
                names,
                "UNSIGNED-PAYLOAD",
            )
        )
        to_sign = "\n".join(
            (ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest())
        )
        signature = hmac.new(self._key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        return f"{url}?{canonical_query}&X-Amz-Signature={signature}"

    def _key(self, day: str) -> bytes:
        key = ("AWS4" + self.credentials.secret_key).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        return key


def _encode(text: str) -> str:
    """RFC 3986 encoding, as SigV4 wants it: only `A-Za-z0-9-_.~` left as they are."""
    return quote(text, safe="-_.~")
