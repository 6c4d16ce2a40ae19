"""A Python object served as an actor: called from Python pools, from a C++ ActorPool (the
calculator example's calculator_pool) and from `troupe call`, and drained by SIGTERM."""

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

import troupe
from conftest import BIN_DIR, Process

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "..", "..", "examples", "calculator", "calculator.capnp")


def serve_python(registry, job_id, count, *flags):
    replicas = []
    for i in range(count):
        env = dict(os.environ, TROUPE_RESOLVER=registry, TROUPE_JOB_ID=job_id,
                   TROUPE_TASK_INDEX=str(i), TROUPE_NUM_TASKS=str(count))
        replicas.append(Process([sys.executable, os.path.join(HERE, "py_calculator.py"), SCHEMA,
                                 *flags], env))
    return replicas


@pytest.fixture(scope="module")
def pycalc(registry):
    replicas = serve_python(registry, "pycalc", 2)
    group = troupe.open_resolver(registry).group("pycalc", "calc")
    try:
        group.wait_ready(2, timeout=30)
        yield group, replicas
    finally:
        for r in replicas:
            r.kill()


def test_a_python_actor_answers_python_calls(pycalc):
    group, _ = pycalc
    pool = group.pool()
    assert pool.call("calc.add", a=1, b=2) == {"value": 3.0}
    assert pool.call("calc.sum", values=[1, 2, 3]) == {"value": 6.0}
    results = pool.broadcast("calc.calls").wait_all(timeout=5)
    assert [r.endpoint for r in results] == ["pycalc/calc-0", "pycalc/calc-1"]
    assert all(r.ok for r in results)


def test_what_a_python_method_raises_is_an_actor_error_with_its_message(pycalc):
    pool = pycalc[0].pool()
    with pytest.raises(troupe.ActorError) as raised:
        pool.call("calc.divide", a=1, b=0)
    assert "ZeroDivisionError" in str(raised.value)
    # The replica goes on serving.
    assert pool.call("calc.divide", a=1, b=4) == {"value": 0.25}


def test_a_cpp_pool_calls_a_python_actor(registry, pycalc):
    out = subprocess.run([os.path.join(BIN_DIR, "calculator_pool"), registry, "pycalc", "2"],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode()
    assert "pool: add(1, 1) = 2" in text
    assert "sum(1..1000) across 2 replicas = 500500" in text


def test_troupe_call_calls_a_python_actor(registry, pycalc):
    out = subprocess.run([os.path.join(BIN_DIR, "troupe"), "call", "--resolver", registry,
                          "pycalc/calc-0", "calc.add", '{"a": 2, "b": 5}'],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout) == {"value": 7}


def test_sigterm_drains_a_python_replica_and_serve_returns(registry):
    (replica,) = serve_python(registry, "pyterm", 1)
    try:
        group = troupe.open_resolver(registry).group("pyterm", "calc")
        group.wait_ready(1, timeout=30)
        assert group.pool().call("calc.add", a=1, b=1) == {"value": 2.0}
        replica.popen.send_signal(signal.SIGTERM)
        assert replica.wait_line("STOPPED") == "STOPPED"
        assert replica.popen.wait(timeout=30) == 0
    finally:
        replica.kill()


def test_a_bad_schema_or_interface_is_refused_clearly(tmp_path):
    with pytest.raises(troupe.InvalidArgument) as raised:
        troupe.serve(SCHEMA, "Nope", object(), name="calc")
    assert "Calculator" in str(raised.value)
    with pytest.raises(troupe.InvalidArgument):
        troupe.serve(str(tmp_path / "missing.capnp"), "Calculator", object(), name="calc")
    with pytest.raises(troupe.InvalidArgument):
        troupe.serve(SCHEMA, "Calculator", object(), name="bad name")


def test_max_concurrency_runs_python_methods_at_once(registry):
    # add() waits until 3 calls of it are in progress: only calls that really overlap answer.
    (replica,) = serve_python(registry, "pyconc", 1, "--rendezvous", "3")
    try:
        group = troupe.open_resolver(registry).group("pyconc", "calc")
        group.wait_ready(1, timeout=30)
        pool = group.pool()

        async def three():
            return await asyncio.gather(*(pool.call_async("calc.add", a=i, b=1)
                                          for i in range(3)))

        assert asyncio.run(three()) == [{"value": 1.0}, {"value": 2.0}, {"value": 3.0}]
        # Alone, a call never meets the other two: the barrier breaks, and the error is the
        # method's own.
        with pytest.raises(troupe.ActorError) as raised:
            pool.call("calc.add", a=1, b=1, timeout=30)
        assert "BrokenBarrierError" in str(raised.value)
    finally:
        replica.kill()
