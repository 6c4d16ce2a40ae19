"""Fixtures for the Python module's tests: a registry and jobs of C++ replicas, started on port 0
and stopped by pid. TROUPE_BIN_DIR names the build's bin folder."""

import contextlib
import os
import queue
import signal
import subprocess
import threading

import pytest

import troupe

BIN_DIR = os.environ.get("TROUPE_BIN_DIR", "")
START_TIMEOUT = 30


class Process:
    """A child whose stdout lines are read on a thread, so that they can be awaited."""

    def __init__(self, args, env=None):
        self.lines = queue.Queue()
        self.popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.popen.stdout:
            self.lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, prefix):
        while True:
            line = self.lines.get(timeout=START_TIMEOUT)
            if line is None:
                raise RuntimeError(f"{self.popen.args[0]} exited ({self.popen.wait()})")
            if line.startswith(prefix):
                return line

    def kill(self, sig=signal.SIGKILL):
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)
        self.popen.wait(timeout=30)


class Job:
    """Replicas of one program, as job `job_id` in the registry `resolver`, with the
    environment `env` (default: this process's) besides."""

    def __init__(self, resolver, job_id, program, count, ready_prefix, env=None):
        self.replicas = []
        base = os.environ if env is None else env
        for i in range(count):
            env = dict(base, TROUPE_RESOLVER=resolver, TROUPE_JOB_ID=job_id,
                       TROUPE_TASK_INDEX=str(i), TROUPE_NUM_TASKS=str(count))
            p = Process([os.path.join(BIN_DIR, program)], env)
            self.replicas.append(p)
        for p in self.replicas:
            p.wait_line(ready_prefix)

    def stop(self):
        for p in self.replicas:
            p.kill()


@contextlib.contextmanager
def job_pool(registry, job_id, program, count, ready_prefix, actor):
    """A Job of `count` replicas and a pool over their `actor`s once all are ready; the job is
    stopped on leaving."""
    job = Job(registry, job_id, program, count, ready_prefix)
    try:
        group = troupe.open_resolver(registry).group(job_id, actor)
        group.wait_ready(count, timeout=START_TIMEOUT)
        yield job, group.pool()
    finally:
        job.stop()


@pytest.fixture(scope="module")
def registry():
    """The URL of a registry of this module's own."""
    p = Process([os.path.join(BIN_DIR, "troupe"), "registry", "--listen", "tcp://127.0.0.1:0"])
    try:
        address = p.wait_line("LISTENING ").split(" ", 1)[1]
        yield "registry://" + address[len("tcp://"):]
    finally:
        p.kill(signal.SIGTERM)


@pytest.fixture(scope="module")
def calc(registry):
    """Job "calc": three calculator_server replicas (examples/calculator)."""
    job = Job(registry, "calc", "calculator_server", 3, "calculator serving at ")
    try:
        yield job
    finally:
        job.stop()
