"""`bash -n` on a submitted shell command: what bash would refuse to parse, told at submission.

A warning in the 201 answer (`warnings`), not a refusal: `bash -n` parses the whole script
before any of it would run, so a script that first turns on an option that changes parsing
(`shopt -s extglob`, then `!(x)`) fails here and runs well on a worker. The script is given on
bash's standard input, never as an argument (no length limit, no quoting) and never through a
shell; bash runs with an empty environment (no `BASH_ENV` to read), is killed past
`TIMEOUT_S`, and executes nothing (`-n`: read commands, do not run them). A command already
checked is remembered (the last `REMEMBERED` ones, by digest): campaigns submit one command
many times.
"""

import asyncio
import hashlib
import logging
import os
import shutil
from collections import OrderedDict
from typing import Final

logger = logging.getLogger(__name__)

#: The longest `bash -n` may take on one command before it is given up (no warning then).
TIMEOUT_S: Final = 2.0
#: Commands remembered with their verdict.
REMEMBERED: Final = 512
#: Lines of bash's complaint kept in the warning.
_MAX_LINES: Final = 3


class SyntaxCheck:
    """Runs `bash -n` on commands and remembers the verdicts; one per api process."""

    def __init__(self, bash: str | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self._bash = bash or shutil.which("bash")
        self._timeout_s = timeout_s
        self._verdicts: OrderedDict[bytes, str | None] = OrderedDict()

    async def warnings(self, command: str) -> list[str]:
        """What bash says of `command` if it cannot parse it (one warning), else nothing."""
        key = hashlib.sha256(command.encode("utf-8", "surrogatepass")).digest()
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
        else:
            self._verdicts[key] = await self._parse(command)
            if len(self._verdicts) > REMEMBERED:
                self._verdicts.popitem(last=False)
        said = self._verdicts[key]
        if said is None:
            return []
        return [
            f"command: bash cannot parse it (`bash -n`): {said}; every task would fail with"
            " exit code 2 (a script that turns on a parsing option first, such as"
            " `shopt -s extglob`, may still run)"
        ]

    async def _parse(self, command: str) -> str | None:
        """bash's complaint about `command` (its first lines), None if it parses (or bash
        cannot be asked: no bash here, or it took too long)."""
        if self._bash is None:
            return None
        proc = await asyncio.create_subprocess_exec(
            "bash",  # its name in what it says, as on a worker
            "-n",
            executable=self._bash,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.defpath, "LC_ALL": "C"},
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                _, stderr = await proc.communicate(command.encode("utf-8", "surrogatepass"))
        except TimeoutError:
            proc.kill()
            await proc.wait()
            logger.warning("bash -n took over %.1f s on a command: not checked", self._timeout_s)
            return None
        if proc.returncode == 0:
            return None
        lines = stderr.decode("utf-8", "replace").splitlines()[:_MAX_LINES]
        return " / ".join(line.strip() for line in lines) or f"bash -n exited {proc.returncode}"
