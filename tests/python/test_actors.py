"""Python classes as actors (troupe.actor): typed from their annotations, hosted in this process
with host_actor() and launched as groups with create_actor_group(); called from Python with
Python values, from `troupe call`, with tracebacks crossing the wire."""

import asyncio
import json
import logging
import os
import subprocess
from typing import Any, Optional

import numpy as np
import pytest

import troupe
from conftest import BIN_DIR
from py_actors import Echo, Keeper, Model, ParameterServer, Shard, received_over


@pytest.fixture
def host(registry, monkeypatch):
    """host(cls, job, name) serves `cls` in this process as replica 0 of `job`; each is stopped
    (and waited for) after the test."""
    started = []

    def start(cls, job, name, **options):
        for key, value in (("TROUPE_RESOLVER", registry), ("TROUPE_JOB_ID", job),
                           ("TROUPE_TASK_INDEX", "0"), ("TROUPE_NUM_TASKS", "1")):
            monkeypatch.setenv(key, value)
        hosted = troupe.host_actor(cls, name=name, **options)
        started.append(hosted)
        group = troupe.open_resolver(registry).group(job, name, cls)
        group.wait_ready(1, timeout=30)
        return hosted, group.pool()

    yield start
    for hosted in started:
        hosted.stop()
        assert hosted.wait(30)


def test_the_schema_follows_the_annotations_with_a_stable_id():
    text = troupe.schema_of(ParameterServer)
    assert "interface ParameterServer {" in text
    assert "pull @0 () -> (value :Tensor);" in text
    assert "push @1 (grad :Tensor) -> (value :Int64);" in text
    assert "stats @2 () -> (value :List(DictOfFloat64));" in text
    assert "struct Tensor { dtype @0 :Text; shape @1 :List(Int64); data @2 :Data; }" in text
    assert text.splitlines()[0] == troupe.schema_of(ParameterServer).splitlines()[0]
    assert text.splitlines()[0] != troupe.schema_of(Echo).splitlines()[0]
    echo = troupe.schema_of(Echo)
    assert "shard @1 (s :Shard) -> (value :Shard);" in echo
    assert "struct Shard { index @0 :Int64; owner @1 :Text; weights @2 :OptionalOfListOfFloat64; }" in echo
    assert "struct OptionalOfListOfFloat64 { union { none @0 :Void; value @1 :List(Float64); } }" in echo
    assert "refuse @6 (why :Text) -> ();" in echo


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(1 << 16, dtype=np.int64),  # large enough to be sent from its own memory
    np.array(3.5, dtype=np.float64),      # 0-d
    np.zeros((0, 3), dtype=np.int16),     # empty
    np.array([True, False, True]),
    np.arange(10, dtype=np.uint8)[::2],   # not contiguous
    np.arange(6, dtype=">i4"),            # not in the machine's byte order
    np.array([1 + 2j], dtype=np.complex128),
    np.arange(4, dtype=np.float16),
], ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_tensors_round_trip_with_their_dtype_and_shape(host, array):
    _, pool = host(Echo, "tensors", "echo")
    back = pool.call("tensor", array)
    assert isinstance(back, np.ndarray)
    assert back.dtype == array.dtype.newbyteorder("=")
    assert back.shape == array.shape
    assert np.array_equal(back, array)


def test_torch_tensors_go_out_as_tensors(host):
    torch = pytest.importorskip("torch")
    _, pool = host(Echo, "torch", "echo")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    back = pool.call("tensor", t)
    assert back.dtype == np.float32 and back.shape == (2, 3)
    assert torch.equal(torch.from_numpy(back.copy()), t)


def test_large_tensors_arrive_over_the_bytes_received_and_outlive_their_call(host):
    _, pool = host(Keeper, "kept", "keeper")
    n = 1 << 18  # 1 MiB of float32: each message's memory would be reused by the next
    for i in range(4):
        assert pool.call("keep", np.full(n, i, dtype=np.float32)) == "message"
    assert pool.call("keep", np.zeros(4, dtype=np.float32)) == "own"  # small: copied
    assert pool.call("sums") == [float((i + 1) * n) for i in range(4)] + [4.0]

    ramps = [pool.call("ramp", n) for _ in range(3)]
    for ramp in ramps:
        assert received_over(ramp) == "message" and ramp.flags.writeable
        assert np.array_equal(ramp, np.arange(n, dtype=np.float32))
    small = pool.call("ramp", 4)
    assert received_over(small) == "own" and small.flags.writeable
    big = pool.broadcast("ramp", n).wait_all(timeout=30)[0].value
    assert received_over(big) == "message"
    assert np.array_equal(big, np.arange(n, dtype=np.float32))


def test_large_bytes_still_arrive_as_bytes(host):
    _, pool = host(Echo, "large-bytes", "echo")
    data = bytes(range(256)) * 4096
    back = pool.call("blob", data, True)
    assert type(back) is bytes and back == data[::-1]


def test_a_request_over_the_message_limit_is_refused_before_it_is_sent(host):
    _, pool = host(Echo, "too-large", "echo")
    # Too large for any Cap'n Proto message; then under that, but over the 512 MiB limit with
    # the call around it. bytes(n) is calloc'd: its pages are never made resident.
    for size in (512 << 20, (512 << 20) - 8):
        data = bytes(size)
        with pytest.raises(troupe.MessageTooLarge) as raised:
            pool.call("blob", data, False)
        del data
        assert raised.value.code == "message_too_large"
        assert raised.value.may_have_run is False
        assert "512 MiB" in str(raised.value) and "broadcast_blob" in str(raised.value)
    assert pool.call("blob", b"abc", True) == b"cba"


def test_an_actor_takes_blobs_while_it_serves(host):
    _, pool = host(Model, "blobs", "model")
    assert "swapIn" not in troupe.schema_of(Model)  # blob handlers are not methods
    for version in (1, 2):
        weights = np.full(1 << 18, version, dtype=np.float32)
        # Read out of this process's memory, then (reads off) through shared memory.
        [result] = pool.broadcast_blob("weights", version, weights, fanout="chain",
                                       same_host_reads=version == 1)
        assert result.ok and result.bytes == weights.nbytes
        assert result.pulled_bytes == (weights.nbytes if version == 1 else 0)
        assert pool.call("held") == {"version": float(version), "sum": float(version << 18),
                                     "writable": 0.0}
    [refused] = pool.broadcast_blob("broken", 3, b"x" * 4096)
    assert not refused.ok
    assert "Refused: version 3 of 4096 bytes" in str(refused.error)
    assert pool.call("held")["version"] == 2.0  # still serving, with what it had


def test_blob_handlers_are_checked_at_decoration():
    with pytest.raises(troupe.AnnotationError) as raised:
        @troupe.actor
        class Twice:
            @troupe.on_blob("w")
            def a(self, version, data):
                pass

            @troupe.on_blob("w")
            def b(self, version, data):
                pass
    assert "blob 'w' is taken already" in str(raised.value)
    with pytest.raises(troupe.AnnotationError) as raised:
        @troupe.actor
        class Async:
            @troupe.on_blob("w")
            async def a(self, version, data):
                pass
    assert "make it a plain 'def'" in str(raised.value)
    with pytest.raises(troupe.AnnotationError) as raised:
        @troupe.actor
        class Short:
            @troupe.on_blob("w")
            def a(self, data):
                pass
    assert "takes (self, version, data), not (self, data)" in str(raised.value)


def test_structs_lists_dicts_optionals_and_bytes_round_trip(host):
    _, pool = host(Echo, "values", "echo")
    assert pool.call("shard", Shard(3, "ps-1", [0.5, 1.5])) == Shard(3, "ps-1", [0.5, 1.5])
    assert pool.call("shard", s=Shard(0, "", None)) == Shard(0, "", None)
    assert pool.call("maybe", 7) == 7
    assert pool.call("maybe") is None
    assert pool.call("table", ["a", "b"], {"a": [1.0, 2.0]}) == {"a": 2, "b": 0}
    assert pool.call("blob", b"abc", True) == b"cba"
    assert pool.call("divide", 1, 4) == 0.25
    assert pool.call("nothing") is None
    with pytest.raises(TypeError) as raised:
        pool.call("divide", "one", 4)
    assert "Echo.divide, parameter 'a': expected float, got str" in str(raised.value)
    with pytest.raises(TypeError):
        pool.call("divide", 1)  # b is missing
    with pytest.raises(AttributeError) as raised:
        pool.call("multiply", 1, 2)
    assert "Echo has no method 'multiply'" in str(raised.value)


def test_a_traceback_crosses_the_wire_with_the_type_of_what_was_raised(host):
    _, pool = host(Echo, "raising", "echo")
    with pytest.raises(troupe.ActorError) as raised:
        pool.call("divide", 1, 0)
    error = raised.value
    assert error.remote_type == "ZeroDivisionError"
    assert error.remote_traceback.startswith("Traceback (most recent call last):")
    assert "in divide" in error.remote_traceback
    assert "return a / b" in error.remote_traceback
    assert "Traceback" not in str(error) and "ZeroDivisionError: " in str(error)
    assert "describePythonError" not in str(error)
    with pytest.raises(troupe.ActorError) as raised:
        pool.call("refuse", "not today")
    assert raised.value.remote_type == "py_actors.Refused"
    assert "not today" in str(raised.value)
    assert pool.call("divide", 1, 2) == 0.5  # it goes on serving


def test_the_replica_logs_what_its_methods_raise_through_logging(host, caplog):
    caplog.set_level(logging.INFO, logger="troupe")
    _, pool = host(Echo, "logged", "echo")
    with pytest.raises(troupe.ActorError):
        pool.call("refuse", "logged here")
    raised = [r for r in caplog.records if "raised py_actors.Refused" in r.getMessage()]
    assert raised and raised[0].name == "troupe" and raised[0].levelno == logging.WARNING
    assert "logged here" in raised[0].getMessage() and "Traceback" in raised[0].getMessage()
    assert any("listening on" in r.getMessage() for r in caplog.records)


def test_annotations_troupe_cannot_map_are_refused_at_decoration():
    def refused(cls):
        with pytest.raises(troupe.AnnotationError) as raised:
            troupe.actor(cls)
        return str(raised.value)

    class NoAnnotation:
        def f(self, x) -> int:
            return x

    class NoReturn:
        def f(self, x: int):
            return x

    class Anything:
        def f(self, x: Any) -> int:
            return 0

    class IntKeys:
        def f(self, x: dict[int, str]) -> int:
            return 0

    class BareList:
        def f(self, x: list) -> int:
            return 0

    class Union:
        def f(self, x: int | str) -> int:
            return 0

    assert "NoAnnotation.f, parameter 'x' has no annotation: write 'x: int'" in \
        refused(NoAnnotation)
    assert "NoReturn.f has no return annotation" in refused(NoReturn)
    assert "Anything.f, parameter 'x': Any is not supported (nothing is pickled" in \
        refused(Anything)
    assert "dict keys must be str" in refused(IntKeys)
    assert "needs its item type: write list[int]" in refused(BareList)
    assert "only Optional[T]" in refused(Union)


def test_troupe_call_and_a_cpp_client_call_a_python_actor(host, registry):
    host(Echo, "fromcli", "echo")
    troupe_bin = os.path.join(BIN_DIR, "troupe")
    out = subprocess.run([troupe_bin, "call", "--resolver", registry, "fromcli/echo-0",
                          "echo.divide", '{"a": 1, "b": 4}'], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout) == {"value": 0.25}
    out = subprocess.run([troupe_bin, "call", "--resolver", registry, "fromcli/echo-0",
                          "echo.divide", '{"a": 1, "b": 0}'], capture_output=True, timeout=60)
    assert out.returncode != 0
    err = out.stderr.decode()
    assert "ZeroDivisionError: float division by zero" in err
    assert "Traceback (most recent call last):" in err and "return a / b" in err


def test_async_methods_run_on_the_actors_asyncio_loop(host):
    _, pool = host(ParameterServer, "asyncps", "ps", args=(4,))
    assert pool.call("push", np.ones(4, np.float32)) == 1

    async def both():
        return await asyncio.gather(pool.aio.stats(), pool.aio.push(grad=np.ones(4, np.float32)))

    stats, version = asyncio.run(both())
    assert version == 2
    assert set(stats) == {"norm", "version"}


def test_a_launched_group_serves_typed_calls_and_closing_it_ends_the_job(registry, tmp_path):
    with troupe.LocalLauncher(registry, log_directory=str(tmp_path)) as launcher:
        group = launcher.create_actor_group(ParameterServer, name="ps", count=2, args=(16,),
                                            kwargs={"lr": 0.5})
        assert group.wait_ready(2, timeout=60) == ["ps/ps-0", "ps/ps-1"]
        pool = group.pool()
        w = pool.call("pull")
        assert w.dtype == np.float32 and w.shape == (16,) and not w.any()
        v = asyncio.run(pool.aio.push(grad=np.ones(16, np.float32)))
        assert v == 1
        every = pool.broadcast("stats").wait_all(timeout=10)
        assert [r.endpoint for r in every] == ["ps/ps-0", "ps/ps-1"]
        assert sorted(r.value["version"] for r in every) == [0.0, 1.0]
        assert sorted(r.value["norm"] for r in every) == [0.0, pytest.approx(2.0)]
        assert sorted(pool.broadcast("where").wait_all(10)[i].value for i in (0, 1)) == \
            ["ps/0", "ps/1"]

        # The other ways to wait for a broadcast, and their asyncio forms.
        first = pool.broadcast("where").wait_any(timeout=10)
        assert first.ok and first.value in ("ps/0", "ps/1")
        both = pool.broadcast("where").wait_quorum(2, timeout=10)
        assert sorted(r.value for r in both) == ["ps/0", "ps/1"]
        once = pool.broadcast("where")
        once.wait_all(10)
        with pytest.raises(troupe.InvalidArgument):
            once.wait_any(10)

        async def waits():
            ready = await group.wait_ready_async(2, timeout=10)
            every = await (await pool.broadcast_async("where")).wait_all_async(10)
            any_one = await pool.broadcast("where").wait_any_async(10)
            quorum = await pool.broadcast("where").wait_quorum_async(1, 10)
            return ready, [r.value for r in every], any_one.value, [r.value for r in quorum]

        ready, every, any_one, quorum = asyncio.run(waits())
        assert ready == ["ps/ps-0", "ps/ps-1"] and every == ["ps/0", "ps/1"]
        assert any_one in every and len(quorum) == 1 and quorum[0] in every
        group.close()
        assert group.launched.status() in ("stopped", "succeeded")
        with pytest.raises(troupe.JobEnded):
            group.wait_ready(1, timeout=10)


def test_constructor_arguments_are_checked_before_anything_starts(registry, tmp_path):
    with troupe.LocalLauncher(registry, log_directory=str(tmp_path)) as launcher:
        with pytest.raises(TypeError) as raised:
            launcher.create_actor_group(ParameterServer, name="ps", args=("big",))
        assert "ParameterServer(), parameter 'dim': expected int, got str" in str(raised.value)
        with pytest.raises(troupe.InvalidArgument) as raised:
            launcher.create_actor_group(ParameterServer, name="ps", args=(1, 2, 3))
        assert "too many positional arguments" in str(raised.value)


def test_a_class_defined_in_main_is_refused_with_what_to_do(registry, tmp_path):
    class Local:
        def ping(self) -> int:
            return 1

    Local.__module__ = "__main__"
    with troupe.LocalLauncher(registry, log_directory=str(tmp_path)) as launcher:
        with pytest.raises(troupe.InvalidArgument) as raised:
            launcher.create_actor_group(Local, name="local")
        assert "defined in __main__" in str(raised.value)
        assert "move it to a module" in str(raised.value)


# --- Blobs in GPU memory (README, "Blobs in GPU memory") ---------------------------------------

CUDA = troupe.cuda_runtime()
needs_gpu = pytest.mark.skipif(not CUDA["available"], reason=f"no GPU here: {CUDA['reason']}")


@troupe.actor
class GpuModel:
    def __init__(self):
        self.weights = None
        self.version = 0

    @troupe.on_blob("weights", device=0)
    def swap_in(self, version, data):
        self.weights = data  # a troupe.DeviceArray: the GPU memory received into, kept
        self.version = version

    def held(self) -> dict[str, int]:
        return {"version": self.version, "device": self.weights.device,
                "bytes": self.weights.nbytes}

    def checksum(self) -> int:
        return sum(self.weights.to_bytes()) & 0xFFFFFFFF


class FakeCudaArray:
    """What a CUDA tensor shows: __cuda_array_interface__ (here over an address that is no
    device's: it is never read where CUDA is absent)."""
    __cuda_array_interface__ = {"shape": (4096,), "typestr": "|u1", "data": (1 << 40, False),
                                "version": 3}


class FakeDlpackCuda:
    """What a JAX array on a GPU shows: DLPack only."""
    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, stream=None):
        raise AssertionError("not to be called where CUDA is absent")


def test_cuda_runtime_says_what_it_found():
    assert set(CUDA) == {"available", "reason", "library", "version", "devices"}
    assert CUDA["available"] == (CUDA["devices"] > 0)
    assert CUDA["available"] or CUDA["reason"]


@pytest.mark.skipif(CUDA["available"], reason="CUDA is available here")
def test_without_cuda_gpu_memory_is_refused_saying_why(host):
    with pytest.raises(troupe.Unimplemented) as raised:
        troupe.DeviceArray.allocate(4096)
    assert "CUDA is not available here" in str(raised.value)
    assert CUDA["reason"] in str(raised.value)
    _, pool = host(Model, "blobs-nocuda", "model")
    with pytest.raises(troupe.Unimplemented):
        pool.broadcast_blob("weights", 1, FakeCudaArray())
    with pytest.raises(troupe.Unimplemented) as raised:
        troupe.host_actor(GpuModel, name="gpu")
    assert "CUDA is not available here" in str(raised.value)
    with pytest.raises(troupe.Unimplemented):
        pool.broadcast_blob("weights", 1, FakeDlpackCuda())
    _, echo = host(Echo, "tensors-nocuda", "echo")
    with pytest.raises(troupe.Unimplemented):
        echo.call("tensor", FakeCudaArray())  # a Tensor in GPU memory: copied out with CUDA
    assert echo.call("tensor", np.arange(3, dtype=np.int64)).tolist() == [0, 1, 2]


def test_a_blobs_device_is_checked_at_decoration():
    for bad in (-1, True, "cuda:0"):
        with pytest.raises(TypeError):
            troupe.on_blob("w", device=bad)


@needs_gpu
def test_a_blob_goes_from_gpu_memory_into_a_gpu_actor(host):
    _, pool = host(GpuModel, "blobs-gpu", "model")
    data = bytes(range(256)) * (1 << 14)  # 4 MiB
    on_gpu = troupe.DeviceArray.from_bytes(data)
    assert on_gpu.__cuda_array_interface__["data"] == (on_gpu.ptr, False)
    [result] = pool.broadcast_blob("weights", 1, on_gpu, chunk_bytes=1 << 20)
    assert result.ok, result.error
    assert pool.call("held") == {"version": 1, "device": 0, "bytes": len(data)}
    assert pool.call("checksum") == sum(data) & 0xFFFFFFFF
    # From host memory into the GPU too.
    [result] = pool.broadcast_blob("weights", 2, data)
    assert result.ok, result.error
    assert pool.call("held")["version"] == 2


@needs_gpu
def test_a_tensor_in_gpu_memory_goes_out_copied_from_the_gpu(host):
    _, echo = host(Echo, "tensors-gpu", "echo")
    data = bytes(range(200))
    back = echo.call("tensor", troupe.DeviceArray.from_bytes(data))  # uint8, shape (200,)
    assert back.dtype == np.uint8 and back.tobytes() == data
