"""The worker says at startup when moving commands into cgroups will be slow, and how to fix it."""

from shared.host.cgroups import slow_moves_hint

_V1_ONLY = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"


def test_a_cgroup2_mount_without_favordynmods_gets_a_hint_naming_the_remount() -> None:
    mounts = _V1_ONLY + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    hint = slow_moves_hint(mounts)
    assert hint is not None
    assert "mount -o remount,favordynmods /sys/fs/cgroup/unified" in hint


def test_a_cgroup2_mount_with_favordynmods_or_none_at_all_gets_no_hint() -> None:
    with_option = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,favordynmods,nsdelegate 0 0\n"
    assert slow_moves_hint(_V1_ONLY + with_option) is None
    assert slow_moves_hint(_V1_ONLY) is None
