"""Where Vigil puts things in its object store: the keys, made from ids, never from user text
unchecked.

    outputs/JOB/TASK/ATTEMPT/NAME    an output of one task's post-processing attempt
    files/USER/SHA256                a file a user uploaded (`POST /uploads`), by its sha256

A key is written once: a rerun, or a post-processing attempt after a failed one, writes under
its own attempt. Everything of a job is under `outputs/JOB/`, which its purge deletes.
"""

import hashlib
import re
from typing import Final

from shared.objects.store import check_key

_PLAIN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=+@,-]{0,199}")
#: What starts a name's segment made from its hash (a plain name never starts so).
_HASHED: Final = "_h"


def name_segment(name: str) -> str:
    """The key segment of an output's file name: the name itself when it is plain (letters,
    digits, `._=+@,-`, no leading dot, at most 200 characters), else `_h` and the first 40 hex
    digits of its sha256 (names with spaces, non-ASCII letters, a leading dot)."""
    if _PLAIN.fullmatch(name) and not name.startswith(_HASHED):
        return name
    return _HASHED + hashlib.sha256(name.encode()).hexdigest()[:40]


#: The top folders of the keys Vigil writes (anything else in a store is a site's own data).
OUTPUTS: Final = "outputs"
UPLOADS: Final = "files"


def upload_key(user_id: str, sha256: str) -> str:
    """The key of the file user `user_id` uploads whose bytes have `sha256`: a user's own
    (nobody names another's upload by learning its hash)."""
    return check_key(f"{UPLOADS}/{user_id}/{sha256}")


def job_outputs(job_id: str) -> str:
    """The prefix under which every output of job `job_id` is kept."""
    return check_key(f"{OUTPUTS}/{job_id}")


def output_key(job_id: str, task_id: str, attempt: int, name: str) -> str:
    """The key of output `name` of `task_id`'s post-processing attempt `attempt`."""
    return check_key(f"{job_outputs(job_id)}/{task_id}/{attempt}/{name_segment(name)}")
