"""Processes known by (pid, create time): the create time as psutil reports it, zombies dead."""

import os
import subprocess

import psutil

from shared.host.processes import create_time, is_alive


def test_the_create_time_is_the_one_psutil_reports() -> None:
    with subprocess.Popen(["sleep", "5"]) as child:
        try:
            assert create_time(child.pid) == psutil.Process(child.pid).create_time()
            assert create_time(os.getpid()) == psutil.Process().create_time()
        finally:
            child.kill()


def test_a_process_is_alive_only_under_its_own_create_time_and_not_as_a_zombie() -> None:
    with subprocess.Popen(["sleep", "5"]) as child:
        created = create_time(child.pid)
        assert created is not None
        assert is_alive(child.pid, created)
        assert not is_alive(child.pid, created - 10)  # a reused pid: another process
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie now, not reaped
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert not is_alive(child.pid, created)
        child.wait()
    assert create_time(child.pid) is None
    assert not is_alive(child.pid, created)
