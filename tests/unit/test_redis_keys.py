"""Redis key names: one namespace per installation, safe parts only, per-job purge lists."""

import pytest

from shared.messaging.redis_keys import JOB_TTL_S, WORKER_TTL_S, RedisKeys


def test_when_there_is_no_namespace__keys_start_with_vigil() -> None:
    keys = RedisKeys()
    assert keys.worker("h-1") == "vigil:host:h-1:worker"
    assert keys.job_progress("j-1") == "vigil:job:j-1:progress"
    assert keys.job_keys("j-1") == ["vigil:job:j-1:progress", "vigil:job:j-1:exits"]


def test_when_there_is_a_namespace__every_key_is_prefixed_by_it() -> None:
    keys = RedisKeys("t42")
    assert keys.worker("h-1") == "t42:vigil:host:h-1:worker"
    assert keys.job_progress("j-1") == "t42:vigil:job:j-1:progress"
    assert keys.job_keys("j-1") == ["t42:vigil:job:j-1:progress", "t42:vigil:job:j-1:exits"]


def test_when_purging_a_job__its_keys_are_its_own_and_no_other_jobs() -> None:
    keys = RedisKeys("ns")
    assert keys.job_progress("j-1") in keys.job_keys("j-1")
    assert keys.job_progress("j-10") not in keys.job_keys("j-1")
    assert RedisKeys("other").job_progress("j-1") not in keys.job_keys("j-1")


@pytest.mark.parametrize("part", ["", "a:b", "a*", "[ab]", "?", "A", "a b", "a.b"])
def test_when_a_key_part_is_unsafe__value_error_is_raised(part: str) -> None:
    keys = RedisKeys()
    for build in (keys.worker, keys.job_progress, keys.job_keys, keys.job_exits):
        with pytest.raises(ValueError, match="unsafe"):
            build(part)


def test_when_reading_the_ttls__a_worker_expires_fast_and_job_state_lasts_days() -> None:
    assert 0 < WORKER_TTL_S <= 60
    assert JOB_TTL_S >= 24 * 3600


def test_when_a_submit_bucket_is_named__it_is_namespaced_and_takes_safe_parts_only() -> None:
    assert RedisKeys("t42").submit_bucket("ab12") == "t42:vigil:api:submit:ab12"
    with pytest.raises(ValueError, match="unsafe"):
        RedisKeys().submit_bucket("secret token")
