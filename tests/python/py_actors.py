"""troupe.actor classes the tests host and launch: a module of their own, as replicas import
them by module path."""

import asyncio
import dataclasses
import os
from typing import Optional

import numpy as np

import troupe


@dataclasses.dataclass
class Shard:
    index: int
    owner: str
    weights: Optional[list[float]] = None


class Refused(Exception):
    """What Counter.refuse raises."""


@troupe.actor
class ParameterServer:
    def __init__(self, dim: int, lr: float = 0.1):
        self.w = np.zeros(dim, dtype=np.float32)
        self.lr = lr
        self.version = 0

    def pull(self) -> troupe.Tensor:
        return self.w

    def push(self, grad: troupe.Tensor) -> int:
        self.w -= self.lr * grad
        self.version += 1
        return self.version

    async def stats(self) -> dict[str, float]:
        await asyncio.sleep(0)
        return {"norm": float(np.linalg.norm(self.w)), "version": float(self.version)}

    def where(self) -> str:
        return f"{os.environ.get('TROUPE_JOB_ID')}/{os.environ.get('TROUPE_TASK_INDEX')}"


@troupe.actor
class Echo:
    """Every mapped type, each sent back as it came."""

    def tensor(self, t: troupe.Tensor) -> troupe.Tensor:
        return t

    def shard(self, s: Shard) -> Shard:
        return s

    def maybe(self, x: Optional[int] = None) -> Optional[int]:
        return x

    def table(self, names: list[str], scores: dict[str, list[float]]) -> dict[str, int]:
        return {n: len(scores.get(n, [])) for n in names}

    def blob(self, data: bytes, flag: bool) -> bytes:
        return data[::-1] if flag else data

    def divide(self, a: float, b: float) -> float:
        return a / b

    def refuse(self, why: str) -> None:
        raise Refused(why)

    def nothing(self) -> None:
        return None


def received_over(array):
    """What memory a received array lies in: "message" for the bytes troupe received (a view,
    no copy), "own" for memory of its own."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview) and type(base.obj).__name__ == "_ReceivedBytes":
        return "message"
    return "own"


@troupe.actor
class Keeper:
    """Keeps the tensors it is given past the calls that brought them."""

    def __init__(self):
        self.kept = []

    def keep(self, t: troupe.Tensor) -> str:
        t += 1  # received tensors are writable
        self.kept.append(t)
        return received_over(t)

    def sums(self) -> list[float]:
        return [float(t.sum(dtype=np.float64)) for t in self.kept]

    def ramp(self, n: int) -> troupe.Tensor:
        return np.arange(n, dtype=np.float32)


@troupe.actor
class Model:
    """Takes its weights as blobs while it serves: "weights" swaps them in, "broken" refuses."""

    def __init__(self):
        self.weights = np.zeros(0, dtype=np.float32)
        self.version = 0
        self.writable = None

    @troupe.on_blob("weights")
    def swap_in(self, version, data):
        self.writable = not data.readonly
        self.weights = np.frombuffer(data, dtype=np.float32)  # no copy: the bytes received
        self.version = version

    @troupe.on_blob("broken")
    def _refuse(self, version, data):
        raise Refused(f"version {version} of {len(data)} bytes")

    def held(self) -> dict[str, float]:
        return {"version": float(self.version), "sum": float(self.weights.sum(dtype=np.float64)),
                "writable": float(bool(self.writable))}
