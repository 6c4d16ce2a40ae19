"""The Python actor python_bench calls (python3 -m troupe.host bench_py_actors:PyEcho): the same
two calls as BenchEcho, typed from annotations."""

import troupe


@troupe.actor
class PyEcho:
    def echo(self, payload: bytes) -> bytes:
        return payload

    def take(self, payload: troupe.Tensor) -> int:
        return payload.nbytes
