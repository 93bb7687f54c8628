"""The analyser example of the docs: SIGSEGV retried with a new seed, at most twice."""

import importlib.util
import signal
from pathlib import Path
from types import ModuleType

from shared.domain.analyser import Facts, PastAttempt, Verdict
from shared.domain.policy import Policy
from shared.domain.states import FailureClass, TaskState

EXAMPLE = (
    Path(__file__).resolve().parents[2]
    / "examples"
    / "retry-segv"
    / "vigil_retry_segv"
    / "__init__.py"
)


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("retry_segv_analyser", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _segfault(after: int) -> Facts:
    run = PastAttempt("cluster", "failed_on_cluster", "signal", None, signal.SIGSEGV, "h", None)
    return Facts(
        state=TaskState.FAILED_ON_CLUSTER,
        failure_class=FailureClass.SIGNAL,
        policy=Policy(),
        infra_retries=0,
        app_retries=after,
        signal=signal.SIGSEGV,
        history=(run,) * (after + 1),
    )


def test_a_segfault_is_retried_with_a_new_seed_twice_then_given_up() -> None:
    analyser = _example().RetrySegv()
    first, second, third = (analyser.decide(_segfault(n)) for n in range(3))
    assert (first.verdict, second.verdict, third.verdict) == (
        Verdict.RECOVERED,
        Verdict.RECOVERED,
        Verdict.ABANDONED,
    )
    assert first.resume is not None and isinstance(first.resume["seed"], int)


def test_anything_else_is_left_to_the_default_analyser() -> None:
    facts = Facts(
        state=TaskState.FAILED_ON_CLUSTER,
        failure_class=FailureClass.EXIT,
        policy=Policy(),
        infra_retries=0,
        app_retries=0,
        exit_code=1,
    )
    decision = _example().RetrySegv().decide(facts)
    assert (decision.verdict, "not listed for retry" in decision.reason) == (
        Verdict.ABANDONED,
        True,
    )
