"""A member that dies while calls are in flight, and a caller that gives up: what Python callers
see is what C++ callers see."""

import concurrent.futures
import os
import signal
import subprocess
import sys

import pytest

import troupe
from conftest import job_pool


def holding_member(pool, replicas):
    """The replica whose blocker holds a call now, found by asking every member."""
    for r in pool.broadcast("blocker.stats").wait_all(timeout=5):
        if r.ok and r.value["started"] > r.value["finished"] + r.value["cancelled"]:
            return replicas[int(r.endpoint.rsplit("-", 1)[1])]
    return None


def hold_until_held(pool, replicas, executor, **options):
    """Starts a blocker.hold through `pool` on a thread; returns its future and the replica
    holding it, once one does."""
    future = executor.submit(pool.call, "blocker.hold", tag="t", replyBytes=0, **options)
    while True:
        # Each round trip waits on the members themselves; the hold arrives within a few.
        held = holding_member(pool, replicas)
        if held is not None:
            return future, held
        assert not future.done(), future.result()


_jobs = iter(range(1000))


@pytest.fixture
def blockers(registry):
    """Two troupe_test_server replicas of a job of the test's own, and a pool over their
    blockers (which take any number of calls at once)."""
    with job_pool(registry, f"hold-{next(_jobs)}", "troupe_test_server", 2, "PUBLISHED",
                  "blocker") as (job, pool):
        yield pool, job


def test_a_call_not_marked_idempotent_raises_may_have_run_when_its_member_dies(blockers):
    pool, job = blockers
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        future, held = hold_until_held(pool, job.replicas, executor)
        held.kill()
        with pytest.raises(troupe.MayHaveRun) as raised:
            future.result(timeout=30)
    assert raised.value.code == "may_have_run"
    assert raised.value.may_have_run is True


def test_an_idempotent_call_goes_to_another_member_when_its_member_dies(blockers):
    pool, job = blockers
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        future, held = hold_until_held(pool, job.replicas, executor, idempotent=True)
        held.kill()
        # It runs again on the survivor, where it holds until released.
        survivor = next(r for r in job.replicas if r is not held)
        while holding_member(pool, job.replicas) is not survivor:
            assert not future.done(), future.result()
        released = pool.broadcast("blocker.release", tag="t").wait_all(timeout=5)
        assert any(r.ok and r.value["released"] for r in released)
        assert future.result(timeout=30) == {"tag": "t", "payload": b""}


def test_big_data_goes_both_ways_from_any_buffer(registry):
    with job_pool(registry, "bigdata", "troupe_test_server", 1, "PUBLISHED", "echo") as (_, pool):
        payload = os.urandom(64 * 1024 * 1024)
        assert pool.call("echo.echo", payload=payload)["payload"] == payload
        assert pool.call("echo.echo", payload=bytearray(b"abc"))["payload"] == b"abc"
        assert pool.call("echo.echo", payload=memoryview(payload)[:1000])["payload"] == payload[:1000]
        with pytest.raises(troupe.InvalidArgument) as raised:
            pool.call("echo.echo", payload="text is not data")
        assert "'payload' must be Data, got str" in str(raised.value)
        # A buffer on no 8-byte boundary is copied, and arrives the same.
        assert pool.call("echo.echo", payload=memoryview(payload)[3:4099])["payload"] == \
            payload[3:4099]


def test_a_buffer_sent_without_a_copy_is_released_when_the_call_returns(registry):
    with job_pool(registry, "borrowed", "troupe_test_server", 2, "PUBLISHED", "echo") as (_, pool):
        buffer = bytearray(os.urandom(1 << 20))
        sent = bytes(buffer)
        assert pool.call("echo.echo", payload=buffer)["payload"] == sent
        # Exported while a message referred to it (a bytearray cannot be resized then), and
        # let go of by the time the call returned.
        buffer.extend(b"12345678")
        # Every member of a broadcast gets the same buffer, let go of with the broadcast (on
        # the loop, which any later call waits behind).
        results = pool.broadcast("echo.echo", payload=memoryview(buffer)).wait_all(timeout=30)
        assert [r.value["payload"] == bytes(buffer) for r in results] == [True, True]
        assert pool.call("echo.echo", payload=b"")["payload"] == b""
        buffer.extend(b"12345678")


CTRL_C_CALLER = r"""
import sys, troupe
pool = troupe.open_resolver(sys.argv[1]).group(sys.argv[2], "blocker").pool()
print("CALLING", flush=True)
try:
    pool.call("blocker.hold", tag="forever", replyBytes=0)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
"""


def test_ctrl_c_interrupts_a_waiting_call_and_cancels_it(registry, blockers):
    pool, job = blockers
    job_id = pool.group.job
    caller = subprocess.Popen([sys.executable, "-c", CTRL_C_CALLER, registry, job_id],
                              stdout=subprocess.PIPE)
    try:
        assert caller.stdout.readline() == b"CALLING\n"
        while holding_member(pool, job.replicas) is None:
            assert caller.poll() is None
        caller.send_signal(signal.SIGINT)
        assert caller.stdout.readline() == b"INTERRUPTED\n"
        assert caller.wait(timeout=30) == 0
        # The call is cancelled on the member too.
        while not any(r.ok and r.value["cancelled"] == 1
                      for r in pool.broadcast("blocker.stats").wait_all(timeout=5)):
            assert caller.poll() == 0
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()


def test_a_calls_timeout_bounds_its_wait_for_members(registry):
    pool = troupe.open_resolver(registry).group("nobody-here", "calc").pool()
    with pytest.raises(troupe.DeadlineExceeded) as raised:
        pool.call("calc.add", a=1, b=2, timeout=0.5)
    # The call's 0.5 s, not the pool's default deadline of 60 s.
    assert "were ready after 500 ms; none registered" in str(raised.value)


def test_an_unreachable_resolver_is_unreachable_not_none_registered():
    import socket
    with socket.socket() as s:  # a loopback port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    resolver = troupe.open_resolver(f"registry://127.0.0.1:{port}")
    with pytest.raises(troupe.Unreachable):
        resolver.ls()
    pool = resolver.group("calc", "calc").pool()
    with pytest.raises(troupe.Unreachable) as raised:
        pool.call("calc.add", a=1, b=2, timeout=0.5)
    assert "the resolver cannot be reached" in str(raised.value)
    assert "none registered" not in str(raised.value)
