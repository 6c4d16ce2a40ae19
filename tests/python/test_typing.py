"""The module's type stubs (troupe/__init__.pyi, py.typed) as a type checker sees them: a
program using the API as documented checks clean with mypy, and one that misuses it is told
where."""

import os
import subprocess
import sys

import pytest

PACKAGE_DIR = os.path.dirname(os.path.dirname(__import__("troupe").__file__))

GOOD = '''
import numpy as np
import troupe

@troupe.actor
class Scaler:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def scale(self, x: troupe.Tensor) -> troupe.Tensor:
        return x * self.factor

    @troupe.on_blob("factor")
    def take(self, version: int, data: memoryview) -> None:
        self.factor = float(np.frombuffer(data, np.float64)[0])

def main() -> None:
    resolver = troupe.open_resolver("registry://127.0.0.1:7700", token_file="/run/token")
    names: list[str] = [e["name"] for e in resolver.ls("job/")]
    with troupe.LocalLauncher() as launcher:
        group = launcher.create_actor_group(Scaler, name="scaler", count=2, args=(2.0,),
                                            resources=troupe.ResourceConfig.with_cpu(1))
        ready: list[str] = group.wait_ready(2, timeout=60)
        pool = group.pool()
        out = pool.call("scale", np.ones(4))
        results = pool.broadcast_blob("factor", 1, np.array([3.0]), fanout="chain")
        ok: bool = all(r.ok for r in results)
        every = pool.broadcast("scale", np.ones(2)).wait_all(timeout=5)
        print(names, ready, out, ok, [r.value for r in every])
    plain = resolver.group("calc", "calc").pool(timeout=2.0)
    value: dict = plain.call("add", a=1, b=2)
    try:
        plain.call("add", {"a": 1}, idempotent=True)
    except troupe.MayHaveRun as e:
        print(e.may_have_run, e.code, value)
'''

BAD = '''
import troupe
resolver = troupe.open_resolver("registry://127.0.0.1:7700", token=b"secret")
count: str = troupe.open_resolver().group("j", "a").wait_ready("two")
'''


def mypy(tmp_path, source):
    if subprocess.run([sys.executable, "-c", "import mypy"], capture_output=True).returncode:
        pytest.skip("mypy is not installed for this Python (Debian's mypy)")
    program = tmp_path / "program.py"
    program.write_text(source)
    env = dict(os.environ, MYPYPATH=PACKAGE_DIR)
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                           "--ignore-missing-imports", "--follow-imports=silent",
                           "--cache-dir", str(tmp_path / "cache"), str(program)],
                          capture_output=True, text=True, env=env, timeout=300)


def test_a_program_using_the_api_checks_clean(tmp_path):
    out = mypy(tmp_path, GOOD)
    assert out.returncode == 0, out.stdout + out.stderr


def test_misuse_is_reported_where_it_is(tmp_path):
    out = mypy(tmp_path, BAD)
    assert out.returncode == 1
    assert 'Unexpected keyword argument "token" for "open_resolver"' in out.stdout
    assert "program.py:4:" in out.stdout  # wait_ready("two"), and its result is no str
