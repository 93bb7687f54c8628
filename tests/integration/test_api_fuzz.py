"""Fuzzing the api with schemathesis: generated requests for every operation of its OpenAPI
schema, in process (ASGI), as an operator, on a database of this module's own.

Each response must not be a 5xx, must have a status the schema documents, and must match the
schema of that status. Bounded: `EXAMPLES` cases per operation. `GET /events` is left out: it
is an endless stream, which the in-process transport would read until it ends.
"""

import os
import uuid
from collections.abc import Iterator
from typing import Any, Final

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import FlakyStrategyDefinition, Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.api.app import create_app
from services.api.settings import ApiSettings
from tests.conftest import AMQP_URL, REDIS_URL, fresh_database

pytestmark = pytest.mark.integration

#: Generated cases per operation and mode (about 15 operations: well under a minute); set
#: `VIGIL_FUZZ_EXAMPLES` higher for a longer hunt.
EXAMPLES: Final = int(os.environ.get("VIGIL_FUZZ_EXAMPLES", "25"))
#: Fuzz only the operations whose label (`GET /jobs/{job_id}`) contains this.
ONLY: Final = os.environ.get("VIGIL_FUZZ_ONLY", "")
TOKEN: Final = f"fuzz-{uuid.uuid4().hex}"
CHECKS: Final = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzzed_app() -> Iterator[Any]:
    """The app on a database of its own, its lifespan run by schemathesis's event loop."""
    with fresh_database("vigil_fuzz") as url:
        settings = ApiSettings(
            database_url=url,
            amqp_url=AMQP_URL,
            redis_url=REDIS_URL,
            namespace=f"fuzz{uuid.uuid4().hex[:10]}",
            bootstrap_token=TOKEN,
            submit_burst=1_000_000,
            submit_rate_per_s=1_000_000,
        )
        app = create_app(settings)
        try:
            yield app
        finally:
            asgi.shutdown_lifespans()  # closes the pool before the database is dropped


def _fuzz(operation: Any, mode: GenerationMode) -> str | None:
    """Run `EXAMPLES` generated cases of one operation; the (shrunk) failure, or None."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases on every run: a failure here is reproducible
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
    )
    def run(case: Any) -> None:
        case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, checks=CHECKS)

    for _ in range(3):
        try:
            run()
        except Unsatisfiable:  # nothing to make invalid (e.g. no parameters): nothing to test
            return None
        except FlakyStrategyDefinition:
            # schemathesis adapts its generation to the app's earlier answers, which hypothesis
            # may see as a strategy that changed between runs: a fault of the harness, run again
            continue
        except (Exception, FailureGroup) as exc:  # reported with every other, then asserted on
            return f"{operation.label} ({mode.value}): {_describe(exc)}"
        return None
    return f"{operation.label} ({mode.value}): generation kept changing between runs"


def _describe(exc: BaseException) -> str:
    """The failure with what it groups (hypothesis wraps a flaky failure in a group)."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, BaseExceptionGroup):
        text += "".join(f"\n  - {_describe(inner)}" for inner in exc.exceptions)
    if exc.__cause__ is not None:  # hypothesis wraps a BaseException (a FailureGroup) this way
        text += f"\n  caused by {_describe(exc.__cause__)}"
    return text


#: Every operation twice, EXAMPLES cases each: about a minute alone, more on loaded cores.
@pytest.mark.timeout(300)
def test_when_any_request_is_made__the_answer_is_documented_and_never_a_server_error(
    fuzzed_app: Any,
) -> None:
    # given: every operation of the schema but the endless event stream
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)
    found = [op.ok() for op in schema.get_all_operations() if isinstance(op, Ok)]
    operations = [op for op in found if op.path != "/events" and ONLY in op.label]
    assert len(operations) >= (1 if ONLY else 14)  # the dashboard's pages are not in it

    # when
    failures = [
        failure
        for operation in operations
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        if (failure := _fuzz(operation, mode)) is not None
    ]

    # then
    assert not failures, "\n\n".join(failures)
