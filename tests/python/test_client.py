"""The Python client against the C++ calculator example: calls, keyword parameters, broadcasts,
asyncio, and every error a caller can get before and after sending."""

import asyncio

import pytest

import troupe
from conftest import job_pool


@pytest.fixture(scope="module")
def pool(registry, calc):
    group = troupe.open_resolver(registry).group("calc", "calc")
    assert len(group.wait_ready(3, timeout=30)) == 3
    return group.pool()


def test_a_call_with_a_dict_returns_the_results_as_a_dict(pool):
    assert pool.call("calc.add", {"a": 1, "b": 2}) == {"value": 3.0}


def test_keyword_parameters_and_the_bare_method_name_work_too(pool):
    assert pool.call("add", a=1.5, b=2, idempotent=True, timeout=2.0) == {"value": 3.5}


def test_lists_go_as_lists(pool):
    assert pool.call("calc.sum", values=[1, 2, 3.5]) == {"value": 6.5}


def test_a_broadcast_gives_one_result_per_member(pool):
    results = pool.broadcast("calc.calls").wait_all(timeout=5)
    assert [r.endpoint for r in results] == ["calc/calc-0", "calc/calc-1", "calc/calc-2"]
    assert all(r.ok and r.error is None for r in results)
    assert all(isinstance(r.value["count"], int) for r in results)


def test_calls_go_round_robin(pool):
    before = [r.value["count"] for r in pool.broadcast("calc.calls").wait_all(timeout=5)]
    for _ in range(6):
        pool.call("calc.add", a=1, b=1)
    after = [r.value["count"] for r in pool.broadcast("calc.calls").wait_all(timeout=5)]
    # Each member served two adds (and one calls() of the first broadcast).
    assert [a - b for a, b in zip(after, before)] == [3, 3, 3]


def test_what_the_actor_raises_is_an_actor_error_with_its_message(pool):
    with pytest.raises(troupe.ActorError) as raised:
        pool.call("calc.divide", a=1, b=0)
    assert raised.value.code == "failed"
    assert "zero" in str(raised.value)
    assert isinstance(raised.value, troupe.Error)


def test_an_actor_error_from_a_pool_names_the_member_that_raised_it(pool):
    # Three calls in a row go to the three members in turn.
    named = []
    for _ in range(3):
        with pytest.raises(troupe.ActorError) as raised:
            pool.call("calc.divide", a=1, b=0)
        named.append(raised.value.endpoint)
        assert str(raised.value).startswith(f"{raised.value.endpoint}: ")
    assert sorted(named) == ["calc/calc-0", "calc/calc-1", "calc/calc-2"]


def test_a_wrong_field_names_the_field_and_the_signature(pool):
    with pytest.raises(troupe.InvalidArgument) as raised:
        pool.call("calc.add", a=1, c=2)
    message = str(raised.value)
    assert "'c'" in message
    assert "calc.add (a :Float64, b :Float64) -> (value :Float64)" in message
    assert raised.value.may_have_run is False


def test_a_wrong_type_names_the_field_and_the_type(pool):
    with pytest.raises(troupe.InvalidArgument) as raised:
        pool.call("calc.add", a="one", b=2)
    assert "'a' must be Float64, got str" in str(raised.value)
    with pytest.raises(troupe.InvalidArgument) as raised:
        pool.call("calc.sum", values=[1, "x"])
    assert "'values[1]' must be Float64" in str(raised.value)
    with pytest.raises(troupe.InvalidArgument):
        pool.call("calc.add", {"a": 1}, a=2)


def test_an_unknown_method_names_the_known_ones(pool):
    with pytest.raises(troupe.InvalidArgument) as raised:
        pool.call("calc.multiply", a=1, b=2)
    assert "add" in str(raised.value) and "divide" in str(raised.value)
    with pytest.raises(troupe.InvalidArgument):
        pool.call("other.add", a=1, b=2)


def test_calls_from_asyncio_run_concurrently(pool):
    async def main():
        return await asyncio.gather(*(pool.call_async("calc.add", a=i, b=1) for i in range(32)))

    results = asyncio.run(main())
    assert [r["value"] for r in results] == [float(i + 1) for i in range(32)]


def test_an_error_reaches_asyncio_as_the_same_exception(pool):
    async def main():
        return await pool.call_async("calc.divide", a=1, b=0)

    with pytest.raises(troupe.ActorError):
        asyncio.run(main())


def test_waiting_for_members_a_job_lacks_times_out(registry):
    group = troupe.open_resolver(registry).group("nobody", "calc")
    with pytest.raises(troupe.DeadlineExceeded) as raised:
        group.wait_ready(1, timeout=0.2)
    assert raised.value.code == "deadline_exceeded"


def test_a_pool_without_members_gives_up_by_its_deadline(registry):
    pool = troupe.open_resolver(registry).group("nobody", "calc").pool(timeout=0.3)
    with pytest.raises(troupe.Error) as raised:
        pool.call("calc.add", a=1, b=2)
    assert raised.value.code in ("no_endpoints", "deadline_exceeded")


def test_bad_urls_and_names_are_invalid_arguments(registry):
    with pytest.raises(troupe.InvalidArgument):
        troupe.open_resolver("nonsense://x")
    with pytest.raises(troupe.InvalidArgument):
        troupe.open_resolver(registry).group("bad job", "calc")
    with pytest.raises(troupe.InvalidArgument):
        troupe.open_resolver(registry).group("calc", "calc").wait_ready(1, timeout=-1)


def test_members_lists_every_endpoint_with_its_state(registry, calc):
    group = troupe.open_resolver(registry).group("calc", "calc")
    group.wait_ready(3, timeout=30)
    members = group.members()
    assert [m["name"] for m in members] == ["calc/calc-0", "calc/calc-1", "calc/calc-2"]
    assert all(m["state"] == "ready" and m["address"].startswith("tcp://") for m in members)


def test_calls_go_on_after_a_member_is_killed(registry):
    with job_pool(registry, "victim", "calculator_server", 2, "calculator serving at ",
                  "calc") as (job, pool):
        assert pool.call("calc.add", a=1, b=1) == {"value": 2.0}
        job.replicas[0].kill()
        # Calls that reach the dead member never ran there: they go to the other one.
        for i in range(10):
            assert pool.call("calc.add", a=i, b=1, idempotent=(i % 2 == 0)) == {"value": i + 1.0}
        # The survivor answers; the dead member, if the pool still lists it, fails.
        results = {r.endpoint: r for r in pool.broadcast("calc.calls").wait_all(timeout=5)}
        assert results["victim/calc-1"].ok
        if "victim/calc-0" in results:
            assert isinstance(results["victim/calc-0"].error, troupe.Error)


def test_connect_calls_one_actor_at_its_address(registry, calc):
    group = troupe.open_resolver(registry).group("calc", "calc")
    group.wait_ready(3, timeout=30)
    member = group.members()[1]
    ref = troupe.connect(member["address"], "calc")
    assert ref.address == member["address"]
    assert ref.call("calc.add", a=2, b=2) == {"value": 4.0}
    with pytest.raises(troupe.ActorError):
        ref.call("divide", a=1, b=0)
    assert asyncio.run(ref.call_async("calc.add", a=1, b=1)) == {"value": 2.0}


def test_connect_to_nothing_is_unreachable_and_a_bad_address_invalid():
    with pytest.raises(troupe.InvalidArgument):
        troupe.connect("nowhere", "calc")
    # A unix socket path nobody listens on: the connection is refused at once.
    ref = troupe.connect("unix:/nonexistent/troupe.sock", "calc")
    with pytest.raises(troupe.Unreachable) as raised:
        ref.call("calc.add", a=1, b=1, timeout=5)
    assert raised.value.may_have_run is False


def test_a_broadcast_is_collected_once(pool):
    broadcast = pool.broadcast("calc.calls")
    assert len(broadcast.wait_all(timeout=5)) == 3
    with pytest.raises(troupe.InvalidArgument):
        broadcast.wait_all(timeout=5)


def test_a_first_asyncio_call_learns_the_interface_without_blocking_the_loop(registry):
    # No member ever comes: the first call waits for one to learn the interface from, and the
    # loop goes on meanwhile (the other task runs before the call gives up).
    pool = troupe.open_resolver(registry).group("nobody-async", "calc").pool(timeout=0.3)

    async def main():
        order = []

        async def other():
            order.append("other")

        task = asyncio.create_task(other())
        with pytest.raises(troupe.Error) as raised:
            await pool.call_async("calc.add", a=1, b=2)
        order.append("call")
        await task
        return order, raised.value.code

    order, code = asyncio.run(main())
    assert order == ["other", "call"]
    assert code in ("no_endpoints", "deadline_exceeded")


def test_asyncio_loops_come_and_go(pool):
    # Each asyncio.run() is a loop of its own; each gets its answers.
    for i in range(5):
        assert asyncio.run(pool.call_async("calc.add", a=i, b=i)) == {"value": 2.0 * i}


def test_numbers_past_their_type_are_invalid_arguments(pool):
    with pytest.raises(troupe.InvalidArgument) as raised:
        pool.call("calc.add", a=10**400, b=1)
    assert "'a' is out of range for Float64" in str(raised.value)
    # A timeout past any deadline is as good as none.
    assert pool.call("calc.add", a=1, b=2, timeout=1e300) == {"value": 3.0}


FORKED_CHILD = """
import os, sys, troupe
pool = troupe.open_resolver(sys.argv[1]).group("calc", "calc").pool()
assert pool.call("calc.add", a=1, b=1) == {"value": 2.0}
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        pool.call("calc.add", a=1, b=1)
        message = "the call went through"
    except troupe.Error as e:
        message = str(e)
    os.write(write, message.encode())
    os._exit(0)
os.close(write)
print(os.read(read, 4096).decode(), flush=True)
os.waitpid(pid, 0)
print(pool.call("calc.add", a=2, b=2)["value"], flush=True)
"""


def test_a_forked_child_is_told_it_cannot_use_the_parents_troupe(registry, calc):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", FORKED_CHILD, registry], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    child, parent = out.stdout.splitlines()
    assert "cannot be used in a child made by fork()" in child
    assert parent == "4.0"  # the parent goes on
