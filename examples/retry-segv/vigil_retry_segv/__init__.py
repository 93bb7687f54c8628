"""An example analyser: retry a SIGSEGV with a new seed, at most twice.

A package of its own: `pip install ./examples/retry-segv` where the scheduler runs (its
`pyproject.toml` registers it), then name it in a job's policy (`"analyser": "retry-segv"`).
A site's own analyser registers the same way:

    [project.entry-points."vigil.analysers"]
    retry-segv = "vigil_retry_segv:RetrySegv"

It asks the default analyser first (design §5), then adjusts the decision with what it knows:
a command killed by SIGSEGV, fewer than two earlier SIGSEGVs in the task's history, is recovered
in place with `{"seed": <new seed>}` in `$VIGIL_RESUME`.
"""

import random
import signal

from shared.domain.analyser import Decision, DefaultAnalyser, Facts, Verdict
from shared.domain.states import FailureClass, TaskState

MAX_SEGV_RETRIES = 2


class RetrySegv:
    """`DefaultAnalyser`, except that a segmentation fault gets a new seed twice."""

    def __init__(self) -> None:
        self._default = DefaultAnalyser()

    def decide(self, facts: Facts) -> Decision:
        decision = self._default.decide(facts)
        segfault = (
            facts.state is TaskState.FAILED_ON_CLUSTER
            and facts.failure_class is FailureClass.SIGNAL
            and facts.signal == signal.SIGSEGV
        )
        if not segfault or decision.verdict is not Verdict.ABANDONED:
            return decision
        earlier = sum(
            a.signal == signal.SIGSEGV for a in facts.history[:-1] if a.stage == "cluster"
        )
        if earlier >= MAX_SEGV_RETRIES:
            return decision
        seed = random.randrange(2**31)
        return Decision(
            Verdict.RECOVERED,
            f"SIGSEGV {earlier + 1}/{MAX_SEGV_RETRIES}: retried with seed {seed}",
            resume={"seed": seed},
        )
