"""Bodies and views of `POST /uploads`: a client asks where to upload a file, by its sha256."""

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.domain import object_refs


class UploadRequest(BaseModel):
    """The body of `POST /uploads`: the sha256 and size of the file to upload."""

    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(description="The sha256 of the file's bytes (64 lowercase hex digits).")
    size: int = Field(
        ge=0,
        le=5 * 1024**4,
        description="The file's size in bytes (at most 5 TiB, an S3 object's largest), counted"
        " against the user's quota of stored bytes from now on (corrected to the size the"
        " store holds when a job names the file).",
    )

    @field_validator("sha256")
    @classmethod
    def _check_sha256(cls, value: str) -> str:
        problem = object_refs.sha256_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class UploadPublic(BaseModel):
    """Where the file goes, and how to put it there."""

    url: str = Field(
        description="The object's URL, to name the file by in a job's `files` (with its sha256)."
    )
    put_url: str | None = Field(
        description="A link to PUT the file's bytes to, straight to the store, good for"
        " `expires_s`; null when the store already holds these bytes there."
    )
    expires_s: int | None = Field(default=None, description="How long `put_url` is good for.")
