"""The `VIGIL_*` variables read outside the services' settings models, and the check that
names, at a service's start, every `VIGIL_*` variable of its environment that nothing reads.

The settings models (`services/settings_catalog.py` lists them) declare every service's
setting; `READ_ELSEWHERE` is every other `VIGIL_*` variable some part of Vigil reads or sets.
Together they are the names Vigil knows: a variable outside them is a typo or a leftover, and
pydantic-settings would ignore it without a word.
"""

import difflib
from collections.abc import Iterable, Mapping
from typing import Final

from shared.runtime.config import ENV_PREFIX

#: Each `VIGIL_*` variable read or set outside the settings models: who reads it, and what for.
READ_ELSEWHERE: Final[Mapping[str, str]] = {
    # the `vigil` command and client library (vigil/config.py)
    "VIGIL_URL": "the vigil CLI and client: the api's URL (several: the apis of one installation)",
    "VIGIL_TOKEN": "the vigil CLI and client: the token they send",
    "VIGIL_CONFIG": "the vigil CLI and client: their TOML config file",
    # what a job's command sees (shared/task_types/base.py, services/worker/ledger.py)
    "VIGIL_JOB_ID": "a job's command: its job",
    "VIGIL_TASK_ID": "a job's command: its task",
    "VIGIL_TASK_INDEX": "a job's command: its task's index in the job",
    "VIGIL_INPUT": "a job's command: its task's input",
    "VIGIL_RUN_NUMBER": "a job's command: which run of its task this is",
    "VIGIL_ATTEMPT": "a job's command: which attempt of this run",
    "VIGIL_TRY": "a job's command: which try of this attempt",
    "VIGIL_WORKDIR": "a job's command: its work dir",
    "VIGIL_STATUS_FILE": "a job's command: where it may write its own diagnosis",
    "VIGIL_RESUME": "a job's command: what its analyser told it to resume from",
    "VIGIL_GPUS": "a job's command: the GPU devices it holds",
    "VIGIL_MARK": "a job's processes: the mark the worker and supervisor find them by",
    # scripts/ and .ci/run
    "VIGIL_VENV": "scripts/: the virtualenv (default .venv)",
    "VIGIL_PYTHON": "scripts/: the Python the virtualenv is made with",
    "VIGIL_NO_HOST_CHANGES": "scripts/: 1 installs no Debian package and remounts nothing",
    "VIGIL_SKIP_SERVER_CHECK": "scripts/test: 1 skips the check of the three servers",
    "VIGIL_INSTALL_SERVERS": "scripts/: 1 installs a missing server with apt-get",
    "VIGIL_STOP_TIMEOUT": "scripts/down: seconds of grace after SIGTERM before SIGKILL",
    "VIGIL_API_URL": "scripts/demo.py (set by scripts/up): the api's URL",
    "VIGIL_RABBITMQ_UI_PORT": "docker-compose.yml: where RabbitMQ's management UI is published",
    "VIGIL_SLURM_DIR": "scripts/slurm: the one-node Slurm's files",
    "VIGIL_SLURM_UP_WAIT": "scripts/slurm: seconds to wait for it to answer",
    "VIGIL_S3_DIR": "scripts/s3: the local S3 server's files",
    "VIGIL_S3_PREFIX": "scripts/s3 env: the key prefix of the VIGIL_STORE_URL it prints",
    "VIGIL_S3_UP_WAIT": "scripts/s3: seconds to wait for the S3 server to answer",
    "VIGIL_S3_VOLUME_MB": "scripts/s3: the size of the S3 server's volumes",
    "VIGIL_KEEPER_MIN_UP_S": "scripts/keeper: a service up this long is started again",
    # tests and benches
    "VIGIL_ADMIN_DATABASE_URL": "bench/: the server the benches make their databases on",
    "VIGIL_CHROMIUM": "tests: the browser the dashboard's tests drive",
    "VIGIL_FUZZ_EXAMPLES": "tests: how many examples the api's fuzzing draws",
    "VIGIL_FUZZ_ONLY": "tests: the operations the api's fuzzing runs",
}


def unknown_settings(environ: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """A warning for each `VIGIL_*` variable of `environ` not in `known`, naming the closest
    known name when one is close. Names are matched as pydantic-settings reads them, whatever
    their case."""
    names = sorted({name.upper() for name in known})
    found = set(names)
    warnings = []
    for variable in sorted(environ):
        name = variable.upper()
        if not name.startswith(ENV_PREFIX) or name in found:
            continue
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        warnings.append(f"unknown setting {variable}{hint}")
    return warnings
