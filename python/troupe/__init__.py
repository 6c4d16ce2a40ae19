"""troupe from Python: find actors through a resolver, call them through pools with failover,
broadcast to every member, with values as dicts and troupe's errors as exceptions.

    import troupe
    resolver = troupe.open_resolver("registry://127.0.0.1:7700")
    group = resolver.group("calc", "calc")
    group.wait_ready(3, timeout=30)
    pool = group.pool()
    pool.call("calc.add", a=1, b=2)            # {'value': 3.0}

Calls run on an event loop of the module's own, on a thread of its own; a waiting call releases
the GIL, and Ctrl-C interrupts it (cancelling the call). The environment is read as C++
programs read it: TROUPE_RESOLVER, TROUPE_TLS_*, TROUPE_TOKEN_FILE.

troupe logs through Python's logging, to the logger "troupe" (at TROUPE_LOG_LEVEL's level,
default info). Until the program configures logging (a handler on "troupe" or the root logger,
as logging.basicConfig() adds), the records are written to stderr as troupe's C++ programs write
them.
"""

import asyncio
import atexit
import inspect
import json
import logging
import os
import sys
import time
import weakref

from . import _actors, _troupe
from ._types import AnnotationError, Tensor

__version__ = _troupe.__version__

__all__ = [
    # calling actors
    "open_resolver", "connect", "Resolver", "Group", "ActorGroup", "Pool", "TypedPool", "Ref",
    "Broadcast", "Result", "BlobResult",
    # GPU memory
    "DeviceArray", "cuda_runtime",
    # Python classes as actors, and Python objects with a schema file
    "actor", "on_blob", "schema_of", "host_actor", "HostedActor", "serve", "Tensor",
    "AnnotationError",
    # jobs
    "LocalLauncher", "SlurmLauncher", "Job", "ResourceConfig",
    # errors
    "Error", "ActorError", "InvalidArgument", "MayHaveRun", "DeadlineExceeded", "Unreachable",
    "Disconnected", "NoEndpoints", "JobEnded", "Overloaded", "Draining", "QueueFull",
    "ActorNotFound", "Unimplemented", "MessageTooLarge", "Unauthenticated", "PermissionDenied",
    "JobAlreadyExists", "BlobRefused", "BlobAborted",
]


# --- errors ------------------------------------------------------------------------------------

class Error(Exception):
    """A troupe error. `code` is the name of its code in troupe's errors.h ("may_have_run"),
    `endpoint` the member it concerns when known, `may_have_run` whether the call may have
    run (False only when troupe knows it never reached the actor)."""

    def __init__(self, message, code="failed", endpoint=None, may_have_run=True):
        super().__init__(message)
        self.message = message
        self.code = code
        self.endpoint = endpoint
        self.may_have_run = may_have_run

    def __str__(self):
        if self.endpoint:
            return f"{self.endpoint}: {self.message}"
        return self.message


class ActorError(Error):
    """What the actor's own code raised, with its message. Never retried. From a Python actor,
    `remote_type` names the exception's type ("ZeroDivisionError", "mymodule.Refused") and
    `remote_traceback` is the replica's traceback as Python printed it; both are None for an
    actor in another language."""

    _TRACEBACK = "\nTraceback (most recent call last):\n"

    def __init__(self, message, code="failed", endpoint=None, may_have_run=True):
        self.remote_type = None
        self.remote_traceback = None
        at = message.find(self._TRACEBACK)
        if at >= 0:
            # "[<context>: ][remote exception: ]<type>: <message>": the type is the first part
            # that is a (dotted) name.
            head = message[:at]
            parts = head.split(": ")
            for i, part in enumerate(parts[:-1]):
                if part.replace(".", "").replace("_", "").isalnum() and not part[0].isdigit():
                    self.remote_type = part
                    self.remote_traceback = message[at + 1:]
                    message = ": ".join(parts[i:])
                    break
        super().__init__(message, code, endpoint, may_have_run)


class InvalidArgument(Error, ValueError):
    """A bad name, address, option, method or parameter; nothing was sent."""


class MayHaveRun(Error):
    """A call not marked idempotent may have run and no one can tell: the server that got it
    died or restarted, or no longer keeps its reply (README, "Errors and retries")."""


class DeadlineExceeded(Error, TimeoutError):
    """The call's deadline passed; it may have run."""


class Unreachable(Error):
    """No connection could be made; the call never ran."""


class Disconnected(Error):
    """The connection broke; the call may have run."""


class NoEndpoints(Error):
    """The pool had no READY member within the call's deadline."""


class JobEnded(Error):
    """The job has ended: its endpoints are gone."""


class Overloaded(Error):
    """Temporarily unable: back off and retry."""


class Draining(Overloaded):
    """The server drains and takes no new calls; the call never ran."""


class QueueFull(Overloaded):
    """The actor's queue of waiting calls was full; the call never ran."""


class ActorNotFound(Error):
    """No actor is hosted under that name there."""


class Unimplemented(Error):
    """The actor has no such method."""


class MessageTooLarge(Error):
    """A message over the size limit (512 MiB), refused before it was sent: the call never ran.
    Send payloads that large as blobs (Pool.broadcast_blob)."""


class Unauthenticated(Error):
    """The connection presented no cluster credential, or a wrong one."""


class PermissionDenied(Error):
    """The caller lacks the job credential the call needs."""


class JobAlreadyExists(Error):
    """A job of that name is still live."""


class BlobRefused(Error):
    """A receiver refused a blob before any byte moved (no receiver of that name, too big, or a
    version it has)."""


class BlobAborted(Error):
    """A blob transfer was given up part-way (aborted by its sender, superseded by a newer
    version, a chunk failed its checksum, or no progress within its timeout)."""


_CLASSES = {
    "failed": Error,
    "overloaded": Overloaded,
    "disconnected": Disconnected,
    "unimplemented": Unimplemented,
    "actor_not_found": ActorNotFound,
    "draining": Draining,
    "unreachable": Unreachable,
    "deadline_exceeded": DeadlineExceeded,
    "invalid_argument": InvalidArgument,
    "message_too_large": MessageTooLarge,
    "job_ended": JobEnded,
    "no_endpoints": NoEndpoints,
    "may_have_run": MayHaveRun,
    "unauthenticated": Unauthenticated,
    "permission_denied": PermissionDenied,
    "queue_full": QueueFull,
    "job_already_exists": JobAlreadyExists,
    "blob_refused": BlobRefused,
    "blob_aborted": BlobAborted,
    "actor_error": ActorError,
}
_troupe._set_error_classes(_CLASSES)
atexit.register(_troupe._shutdown)

_log = logging.getLogger("troupe")
_LEVEL_NAMES = {5: "trace", 10: "debug", 20: "info", 30: "warning", 40: "error", 50: "critical"}


def _deliver_logs(records):
    # What troupe's loops logged, as (levelno, created, message): to the "troupe" logger once
    # logging is configured, to stderr in troupe's own format until then.
    configured = _log.hasHandlers()
    for level, created, message in records:
        if not configured:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
            sys.stderr.write(f"[{stamp}.{int(created % 1 * 1000):03d}] [troupe] "
                             f"[{_LEVEL_NAMES.get(level, level)}] {message}\n")
        elif _log.isEnabledFor(level):
            record = _log.makeRecord(_log.name, level, "(troupe)", 0, message, (), None)
            record.created = created
            record.msecs = int(created % 1 * 1000)
            record.relativeCreated = (created - logging._startTime) * 1000
            _log.handle(record)


_troupe.set_log_handler(_deliver_logs)
atexit.register(_troupe.close_logs)  # runs before _shutdown: later records go to stderr


class _ClosedOnExit:
    """Leaving a `with` block close()s it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- resolvers, groups, pools --------------------------------------------------------------------

def open_resolver(url=None, *, token_file=None, tls_ca=None, tls_cert=None, tls_key=None,
                  tls_server_name=None):
    """A resolver from a URL (registry://HOST:PORT, registry+tls://, etcd://HOST:PORT,
    fixed:NAME=ADDR,..., file:PATH); default $TROUPE_RESOLVER.

    Credentials: `token_file`, a file holding the cluster token (readable by its owner only);
    `tls_ca`, `tls_cert`, `tls_key`, PEM files (the CA that servers' certificates chain to, and
    this client's certificate and key for mutual TLS); `tls_server_name`, the name servers'
    certificates must carry. They apply to the resolver and to its groups' connections to their
    members, and to its pools' blob broadcasts. Given any, the environment's TROUPE_TOKEN and
    TROUPE_TLS_* are not read (a replica's job credential, TROUPE_JOB_TOKEN_FILE, still is);
    given none, they are (as everywhere in troupe). A missing or unfit file raises
    InvalidArgument."""
    if url is None:
        url = os.environ.get("TROUPE_RESOLVER")
        if not url:
            raise InvalidArgument("open_resolver: no URL given and TROUPE_RESOLVER is not set",
                                  code="invalid_argument", may_have_run=False)
    def path(f):
        return os.fspath(f) if f is not None else ""
    return Resolver(_troupe.Resolver(url, token_file=path(token_file), tls_ca=path(tls_ca),
                                     tls_cert=path(tls_cert), tls_key=path(tls_key),
                                     tls_server_name=tls_server_name or ""))


class Resolver:
    def __init__(self, impl):
        self._impl = impl

    @property
    def url(self):
        return self._impl.url

    def __repr__(self):
        return f"<troupe.Resolver {self.url}>"

    def ls(self, prefix="", timeout=10.0):
        """Every endpoint whose name starts with `prefix` ("" for all, "ps/" for job ps's), in
        name order: dicts of name, address, state, incarnation and metadata."""
        return self._impl.list(prefix, timeout)

    def jobs(self, timeout=10.0):
        """Every job the resolver knows, running or ended, in name order: dicts of name, state
        ("running", "succeeded", "failed", "stopped", "unschedulable", or "ended" for a job
        ended otherwise), reason (why it ended), launcher ("local", "slurm", "" for replicas
        started by hand), replicas (how many its launcher runs, 0 if unknown), ready (how many
        of them are ready now), endpoints (registered now), created_at and ended_at (Unix
        seconds; None when unknown, ended_at while it runs)."""
        return self._impl.jobs(timeout)

    def group(self, job, actor, actor_class=None):
        """The ActorGroup of job `job`'s members for `actor` (endpoints job/actor-N). With
        `actor_class` (a troupe.actor class), its pools call methods with Python values."""
        if actor_class is not None:
            return ActorGroup(self._impl.group(job, actor), _actors.spec_of(actor_class))
        return Group(self._impl.group(job, actor))


class Group:
    def __init__(self, impl):
        self._impl = impl

    @property
    def job(self):
        return self._impl.job

    @property
    def actor(self):
        return self._impl.actor

    def __repr__(self):
        return f"<troupe.Group {self.job}/{self.actor}>"

    def wait_ready(self, count=1, timeout=60.0):
        """Waits until `count` members are READY and returns their endpoint names. Raises
        JobEnded at once if the job has ended, DeadlineExceeded after `timeout` seconds."""
        return self._impl.wait_ready(count, timeout)

    async def wait_ready_async(self, count=1, timeout=60.0):
        """wait_ready() for asyncio."""
        return await _bridge().wait(self._impl.start_wait_ready(count, timeout))

    def members(self):
        """Every member the resolver lists, in any state: dicts of name, address, state
        ("starting", "ready", "draining"), incarnation and metadata."""
        return self._impl.members()

    def pool(self, *, balancing="round_robin", max_attempts=5, timeout=None, metrics=True):
        """A pool over this group's READY members. `timeout`: the default deadline of its calls
        in seconds (60)."""
        return Pool(self._impl.pool(balancing, max_attempts, timeout, metrics), self)


class Result:
    """One member's answer to a broadcast."""

    __slots__ = ("endpoint", "value", "error")

    def __init__(self, endpoint, value, error):
        self.endpoint = endpoint
        self.value = value
        self.error = error

    @property
    def ok(self):
        return self.error is None

    def __repr__(self):
        if self.ok:
            return f"Result({self.endpoint!r}, value={self.value!r})"
        return f"Result({self.endpoint!r}, error={self.error!r})"


class Broadcast:
    """One call made to every READY member at once. Wait for it one way, once: wait_all(),
    wait_any() or wait_quorum(k), or their asyncio forms (wait_all_async(), ...)."""

    def __init__(self, impl, convert=None):
        self._impl = impl
        self._convert = convert

    def _results(self, raw):
        out = []
        for endpoint, value, error in raw:
            if error is None and self._convert is not None:
                value = self._convert(value)
            out.append(Result(endpoint, value, error))
        return out

    def wait_all(self, timeout=60.0):
        """One Result per member called, in name order, once all answered or `timeout`
        seconds passed (those that did not answer by then fail with DeadlineExceeded)."""
        return self._results(self._impl.wait_all(timeout))

    def wait_any(self, timeout=60.0):
        """The first member's successful Result. Raises the last error when every member
        failed, NoEndpoints when there were none, DeadlineExceeded after `timeout` seconds."""
        return self._results(self._impl.wait_any(timeout))[0]

    def wait_quorum(self, k, timeout=60.0):
        """The first `k` successful Results, in the order they came, as soon as there are `k`
        (the other calls go on). Raises once fewer than `k` can still succeed, and
        DeadlineExceeded after `timeout` seconds."""
        return self._results(self._impl.wait_quorum(k, timeout))

    async def wait_all_async(self, timeout=60.0):
        return self._results(await _bridge().wait(self._impl.start("all", 0, timeout)))

    async def wait_any_async(self, timeout=60.0):
        return self._results(await _bridge().wait(self._impl.start("any", 0, timeout)))[0]

    async def wait_quorum_async(self, k, timeout=60.0):
        return self._results(await _bridge().wait(self._impl.start("quorum", k, timeout)))


class BlobResult:
    """What became of a blob at one member: `ok`, or `error` (a troupe.Error); `bytes` it
    received; `seconds` from its first request to having the whole blob (as it measured);
    `pulled_bytes`, of `bytes`, those it copied straight from its sender's memory on their host
    (GPU to GPU, or read from the sender's process), not through the connection."""

    __slots__ = ("endpoint", "error", "bytes", "seconds", "pulled_bytes")

    def __init__(self, endpoint, error, nbytes, seconds, pulled_bytes):
        self.endpoint = endpoint
        self.error = error
        self.bytes = nbytes
        self.seconds = seconds
        self.pulled_bytes = pulled_bytes

    @property
    def ok(self):
        return self.error is None

    def __repr__(self):
        return f"BlobResult({self.endpoint!r}, {'ok' if self.ok else repr(self.error)})"


class Pool:
    """Calls into a group's READY members, round-robin with failover: a call that never ran
    goes to another member; one whose connection broke after it left is sent again to the same
    member, which runs it once, or, if idempotent, to another member."""

    def __init__(self, impl, group):
        self._impl = impl
        self.group = group

    def __repr__(self):
        return f"<troupe.Pool {self.group.job}/{self.group.actor}>"

    def call(self, method, params=None, /, *, idempotent=False, timeout=None, **fields):
        """Calls `method` ("add" or "calc.add") with `params` (a dict) or keyword arguments and
        returns its results as a dict."""
        return self._impl.call(method, params, fields, idempotent, timeout, False)

    async def call_async(self, method, params=None, /, *, idempotent=False, timeout=None,
                         **fields):
        """call() for asyncio: the calling thread is free while the call is in flight (and
        while the first call learns the members' interface)."""
        return await _call_async(self._impl, method, params, fields, idempotent, timeout, False)

    def broadcast(self, method, params=None, /, *, timeout=None, **fields):
        """Calls `method` on every READY member at once; wait_all() on the result collects one
        Result per member."""
        return Broadcast(self._impl.broadcast(method, params, fields, timeout, False))

    async def broadcast_async(self, method, params=None, /, *, timeout=None, **fields):
        """broadcast() for asyncio: a Broadcast to await one of its *_async waits on (the first
        call learns the members' interface without blocking the loop)."""
        await _learn_schema(self._impl)
        return self.broadcast(method, params, timeout=timeout, **fields)

    def broadcast_blob(self, name, version, data, *, fanout="star", tree_fanout=2,
                       chunk_bytes=None, window_bytes=None, timeout=60.0,
                       same_host_reads=True):
        """Sends `data` (bytes, bytearray, memoryview, a NumPy array: sent from the buffer
        itself, which must not change meanwhile; or GPU memory: a troupe.DeviceArray or any
        contiguous object with __cuda_array_interface__, such as a CUDA tensor, whose chunks
        are copied out through pinned buffers, or copied GPU to GPU by members on this host that
        receive into a GPU) as blob `name` at `version` to every READY
        member, whose servers accept it with ActorServer::acceptBlobs. `fanout`: "star" (to each
        member), "chain" (each member forwards to the next) or "tree". Waits up to `timeout`
        seconds and returns one BlobResult per member, in name order; a member that dies or
        refuses is routed around and reported. `same_host_reads`: whether members on this host
        may read the chunks straight out of this process's memory (README, "Same host"), rather
        than have them sent through shared memory. Raises NoEndpoints when no member is READY."""
        return [BlobResult(*r) for r in self._impl.broadcast_blob(
            name, version, data, fanout, tree_fanout, chunk_bytes, window_bytes, timeout,
            same_host_reads)]


# --- jobs --------------------------------------------------------------------------------------

DeviceArray = _troupe.DeviceArray
"""Bytes in a GPU's memory, with __cuda_array_interface__ (torch.as_tensor(a, device="cuda") and
CuPy take it without a copy): DeviceArray.allocate(nbytes, device=0), DeviceArray.from_bytes(data,
device=0), to_bytes(), nbytes, device, ptr. What on_blob(name, device=N) hands a blob received
into a GPU as, and one of the things Pool.broadcast_blob sends from. Raises Unimplemented, saying
why, where CUDA is not available."""

cuda_runtime = _troupe.cuda_runtime
"""What troupe found of the CUDA runtime (loaded when first needed, so troupe runs without it):
a dict of available, reason (why not), library, version and devices."""

ResourceConfig = _troupe.ResourceConfig
"""What each replica of a job needs: ResourceConfig.with_cpu(cpus, ram="1g"),
with_gpu(variant, count, cpus=8, ram="64g"), with_tpu(types, slice_count=1)."""


class Job:
    """A submitted job: status() ("pending", "running", "succeeded", "failed", "stopped",
    "unschedulable"), reason(), wait(timeout) for its final phase, logs(lines), terminate()."""

    def __init__(self, impl):
        self._impl = impl

    @property
    def id(self):
        return self._impl.id

    def __repr__(self):
        return f"<troupe.Job {self.id}: {self.status()}>"

    def status(self):
        return self._impl.status()

    def reason(self):
        return self._impl.reason()

    def wait(self, timeout=3600.0):
        """The job's final phase once it reaches one; DeadlineExceeded (the job goes on) after
        `timeout` seconds."""
        return self._impl.wait(timeout)

    def logs(self, lines=100):
        """The last `lines` lines each replica wrote, each "[<index>] ...", in index order."""
        return self._impl.logs(lines)

    def terminate(self, grace=None):
        """SIGTERM to every replica (a troupe replica drains), SIGKILL after `grace` seconds;
        returns once none is left."""
        self._impl.terminate(grace)

    def replicas(self):
        """Per replica: (index, pid, starts, log path)."""
        return self._impl.replicas()


class _Launcher(_ClosedOnExit):
    """What both launchers share: submit(), close(), the resolver their replicas publish in."""

    _impl = None

    @property
    def resolver_url(self):
        return self._impl.resolver_url

    @property
    def log_directory(self):
        return self._impl.log_directory

    def resolver(self):
        """A resolver on the launcher's resolver URL."""
        return open_resolver(self.resolver_url)

    def submit(self, name, argv, *, replicas=0, resources=None, env=None,
               max_retries_failure=0):
        """Starts job `name` running `argv` (the program and its arguments) as `replicas`
        replicas (0: resources.replicas). Raises InvalidArgument for a bad request and
        JobAlreadyExists for the name of a live job."""
        return Job(self._impl.submit(name, [os.fspath(a) for a in argv], replicas, resources,
                                     dict(env or {}), max_retries_failure))

    def create_actor_group(self, actor_class, *, name, count=1, args=(), kwargs=None,
                           resources=None, env=None, max_concurrency=None, job=None,
                           max_retries_failure=0):
        """Starts job `job` (default: `name`) of `count` replicas, each hosting one instance of
        `actor_class` (a class in an importable module, annotated as troupe.actor wants) as
        actor `name`, built from `args` and `kwargs` (typed by its __init__'s annotations; plain
        data, not bytes or tensors, as they travel in the replica's environment). Each replica
        runs `python3 -m troupe.host module:Class` with this interpreter and this process's
        import path. Returns the ActorGroup, which owns the job: closing it ends the job."""
        spec = _actors.spec_of(actor_class)
        if spec.module == "__main__":
            raise InvalidArgument(
                f"{spec.qualname} is defined in __main__, which a replica cannot import: move "
                "it to a module of its own and import it from there", code="invalid_argument",
                may_have_run=False)
        environment = dict(env or {})
        environment[_ARGS_VARIABLE] = _constructor_arguments(spec, args, kwargs or {})
        path = [_import_root(actor_class), os.path.dirname(os.path.dirname(__file__))]
        path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        path += [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p]
        environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in path if p))
        argv = [sys.executable, "-m", "troupe.host", f"{spec.module}:{spec.qualname}",
                "--name", name]
        if max_concurrency is not None:
            argv += ["--max-concurrency", str(max_concurrency)]
        submitted = self.submit(job or name, argv, replicas=count, resources=resources,
                                env=environment, max_retries_failure=max_retries_failure)
        group = _troupe.Resolver(self.resolver_url).group(submitted.id, name)
        return ActorGroup(group, spec, submitted)

    def close(self, grace=None):
        """Stops every job (SIGTERM, then SIGKILL or scancel after `grace` seconds) and waits
        until none is left."""
        self._impl.drain(grace)


class LocalLauncher(_Launcher):
    """Runs jobs as child processes of this one, each replica with TROUPE_JOB_ID,
    TROUPE_TASK_INDEX, TROUPE_NUM_TASKS and TROUPE_RESOLVER set. Without `resolver` it runs a
    registry of its own (its URL: resolver_url). close() (or leaving a `with` block) stops every
    job; so does the end of the program."""

    def __init__(self, resolver="", *, log_directory="", terminate_grace=None, cpus=0.0,
                 ram_bytes=0, gpus=-1):
        self._impl = _troupe.Launcher.local(resolver, log_directory, terminate_grace, cpus,
                                            ram_bytes, gpus)


class SlurmLauncher(_Launcher):
    """Runs each job as one Slurm job (sbatch) whose tasks are its replicas, with troupe's
    environment and TROUPE_TASK_INDEX from SLURM_PROCID. `resolver` (required) must be
    reachable from the cluster's nodes, and `log_directory` (default ~/.troupe/slurm) seen by
    them at the same path. Jobs outlive the launcher: close() (or leaving a `with` block)
    cancels them. `time_limit`, `terminate_grace`, `poll_initial` and `poll_max` are seconds;
    `sbatch_args` more flags for every job ("--account=ml")."""

    def __init__(self, resolver, *, partition="", time_limit=None, log_directory="",
                 terminate_grace=None, poll_initial=None, poll_max=None, sbatch_args=(),
                 program=""):
        self._impl = _troupe.Launcher.slurm(resolver, partition, time_limit, log_directory,
                                            terminate_grace, poll_initial, poll_max,
                                            list(sbatch_args), os.fspath(program))

    def slurm_job_id(self, name):
        """The Slurm job id of job `name`, for scontrol and squeue; 0 until sbatch answered."""
        return self._impl.slurm_job_id(name)


# --- serving -----------------------------------------------------------------------------------

def serve(schema, interface, obj, *, name, listen="", max_concurrency=1, import_path=()):
    """Serves `obj` as actor `name` implementing `interface` of the schema file `schema`, in a
    replica of the job the environment names (TROUPE_JOB_ID, TROUPE_TASK_INDEX,
    TROUPE_RESOLVER), exactly as a C++ replica's hostActor() does: published as
    <job>/<name>-<task>, listed with its schema, drained on SIGTERM or Ctrl-C. Each call runs
    obj.<method>(**params) and its return value (a dict, or None) becomes the results; what it
    raises reaches the caller as an ActorError with its type, message and traceback. Calls run
    one at a time on a serving thread of troupe's own; with `max_concurrency` N other than 1 (0:
    no limit) they run on worker threads, up to N at once, overlapping wherever Python lets go
    of the GIL. Blocks until the replica stops. (host_actor() serves a troupe.actor class
    without a schema file, and returns while it serves.)"""
    import signal
    import threading
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        _troupe.serve(os.fspath(schema), interface, obj, name, listen, max_concurrency,
                      [os.fspath(p) for p in import_path])
    finally:
        # The replica's own handlers (which drain) are gone: Python's come back.
        for s, handler in saved.items():
            signal.signal(s, handler)


# --- Python classes as actors ------------------------------------------------------------------

def actor(cls):
    """Marks `cls` as a troupe actor: its public methods, typed by their annotations, become a
    Cap'n Proto interface named after the class (bool, int, float, str, bytes, list[T],
    dict[str, T], Optional[T], dataclasses and troupe.Tensor; see troupe._types). Checked here:
    an annotation that is missing or cannot be mapped raises AnnotationError naming the method,
    the parameter and what to write instead. Returns `cls` unchanged otherwise."""
    _actors.spec_of(cls)
    return cls


def on_blob(name, device=None):
    """Marks a method of a troupe.actor class as the one that takes blob `name`, which senders
    send with Pool.broadcast_blob(name, version, data):

        @troupe.on_blob("policy")
        def swap_in(self, version, data):   # data: a read-only memoryview, no copy
            ...

    It is called with each version once the blob arrived whole and checked, on the serving
    thread, with the bytes where they were received, kept while `data` (or an array over it) is
    referenced. Methods that run one at a time (the default) never run while it does; with
    max_concurrency other than 1, sync methods of a class without async ones may (guard what
    they share). What it raises is the member's error in the sender's results. It is not part
    of the actor's interface.

    With `device` (a CUDA device's number), the blob is received into that GPU's memory
    (README, "Blobs in GPU memory") and `data` is a troupe.DeviceArray over it, which
    torch.as_tensor(data, device="cuda") and CuPy take without a copy through its
    __cuda_array_interface__; hosting such an actor where CUDA is not available raises
    Unimplemented, saying why."""
    return _actors.on_blob(name, device)


def schema_of(actor_class):
    """The Cap'n Proto schema text troupe generates for `actor_class`."""
    return _actors.spec_of(actor_class).schema_text


class HostedActor:
    """An actor served in this process by host_actor(): `address`, `endpoints`, stop(grace)
    and wait(timeout). Leaving a `with` block stops it and waits."""

    def __init__(self, impl, servant, spec):
        self._impl = impl
        self._servant = servant
        self.spec = spec
        _hosted.add(self)

    @property
    def address(self):
        return self._impl.address

    @property
    def endpoints(self):
        return self._impl.endpoints

    def stop(self, grace=None):
        """Drains: new calls are refused (callers go elsewhere), calls in flight get `grace`
        seconds to finish. Returns at once; wait() for the end."""
        self._impl.stop(grace)

    def wait(self, timeout=None):
        """Waits until stopped (SIGTERM, stop(), or a drain request), up to `timeout` seconds;
        returns whether it stopped. Ctrl-C interrupts it."""
        stopped = self._impl.wait(timeout)
        if stopped:
            self._servant.close()
            _hosted.discard(self)
        return stopped

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        self.wait()

    def __repr__(self):
        return f"<troupe.HostedActor {self.spec.qualname} at {self.address}>"


_hosted = weakref.WeakSet()


@atexit.register
def _stop_hosted():
    for hosted in list(_hosted):
        hosted.stop()
        hosted.wait()


def host_actor(actor, *, name, args=(), kwargs=None, listen="", max_concurrency=None):
    """Serves `actor` (an instance of a troupe.actor class, or the class, built here from
    `args` and `kwargs`) as actor `name` in this process, in the replica of the job the
    environment names (TROUPE_JOB_ID, TROUPE_TASK_INDEX, TROUPE_RESOLVER): published as
    <job>/<name>-<task>, on a thread of its own. Returns a HostedActor once it is published;
    SIGTERM or its stop() drains it. Sync methods run one at a time (or `max_concurrency` at
    once, 0 for no limit, on worker threads); async methods run on an asyncio loop of the
    actor's own, and overlap."""
    if isinstance(actor, type):
        actor = actor(*args, **(kwargs or {}))
    spec = _actors.spec_of(type(actor))
    if max_concurrency is None:
        max_concurrency = 0 if spec.has_async else 1
    servant = _actors.Servant(spec, actor)
    try:
        impl = _troupe.HostedActor(spec.file_name, spec.schema_text, spec.interface, servant,
                                   name, listen, max_concurrency, [], False, True,
                                   [(blob, spec.blob_devices.get(blob, -1))
                                    for blob in spec.blob_handlers])
    except BaseException:
        servant.close()
        raise
    return HostedActor(impl, servant, spec)


_ARGS_VARIABLE = "TROUPE_ACTOR_ARGS"


def _constructor_arguments(spec, args, kwargs):
    """`args` and `kwargs` for spec's class, checked against its __init__, as JSON."""
    sig = inspect.signature(spec.cls.__init__)
    try:
        bound = sig.bind(None, *args, **kwargs)
    except TypeError as e:
        raise InvalidArgument(f"{spec.qualname}(): {e}", code="invalid_argument",
                              may_have_run=False) from None
    given = bound.arguments
    wire = {p.python: p.type.to_wire(given[p.python], f"{spec.qualname}(), parameter "
                                                      f"'{p.python}'")
            for p in spec.init_params if p.python in given}
    try:
        return json.dumps(wire)
    except TypeError:
        raise InvalidArgument(f"{spec.qualname}(): constructor arguments must be plain data "
                              "(no bytes or tensors: send those with a method call)",
                              code="invalid_argument", may_have_run=False) from None


def _construct(spec):
    """An instance of spec's class from the arguments its launcher put in the environment."""
    wire = json.loads(os.environ.pop(_ARGS_VARIABLE, "{}"))
    kwargs = {p.python: p.type.from_wire(wire[p.python]) for p in spec.init_params
              if p.python in wire}
    return spec.cls(**kwargs)


def _import_root(cls):
    """The folder from which `cls`'s module imports (what sys.path needs)."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    root = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path) == "__init__.py":
        root = os.path.dirname(root)
    for _ in range(cls.__module__.count(".")):
        root = os.path.dirname(root)
    return root


class ActorGroup(Group, _ClosedOnExit):
    """A Group of a troupe.actor class's members: its pools call methods with Python values.
    One made by create_actor_group() owns its job (`launched`): close() (or leaving a `with`
    block) ends it."""

    def __init__(self, impl, spec, launched=None):
        super().__init__(impl)
        self.spec = spec
        self.launched = launched

    def pool(self, *, balancing="round_robin", max_attempts=5, timeout=None, metrics=True):
        untyped = super().pool(balancing=balancing, max_attempts=max_attempts, timeout=timeout,
                               metrics=metrics)
        return TypedPool(untyped, self.spec)

    def close(self, grace=None):
        """Ends the job this group was launched as (its replicas drain first)."""
        if self.launched is not None:
            self.launched.terminate(grace)

    def __repr__(self):
        return f"<troupe.ActorGroup {self.job}/{self.actor} of {self.spec.qualname}>"


class TypedPool:
    """A Pool over a troupe.actor class's members: call("push", grad) or aio.push(grad=...)
    take the method's own arguments and return what it returned. `untyped` is the Pool."""

    def __init__(self, untyped, spec):
        self.untyped = untyped
        self.spec = spec
        self.group = untyped.group
        self.aio = _Aio(self)

    def call(self, method, /, *args, idempotent=False, timeout=None, **kwargs):
        m = self.spec.method(method)
        params = self.spec.request(m, args, kwargs)
        # Tensors in the results arrive as arrays over the bytes received (views=True).
        return self.spec.result(m, self.untyped._impl.call(m.capnp, params, {}, idempotent,
                                                           timeout, True))

    async def call_async(self, method, /, *args, idempotent=False, timeout=None, **kwargs):
        m = self.spec.method(method)
        params = self.spec.request(m, args, kwargs)
        results = await _call_async(self.untyped._impl, m.capnp, params, {}, idempotent, timeout,
                                    True)
        return self.spec.result(m, results)

    def broadcast(self, method, /, *args, timeout=None, **kwargs):
        """Calls `method` on every READY member; wait_all() gives one Result per member whose
        value is what the method returned."""
        m = self.spec.method(method)
        params = self.spec.request(m, args, kwargs)
        untyped = self.untyped._impl.broadcast(m.capnp, params, {}, timeout, True)
        return Broadcast(untyped, lambda value: self.spec.result(m, value))

    async def broadcast_async(self, method, /, *args, timeout=None, **kwargs):
        m = self.spec.method(method)
        params = self.spec.request(m, args, kwargs)
        await _learn_schema(self.untyped._impl)
        return self.broadcast(method, *args, timeout=timeout, **kwargs)

    def broadcast_blob(self, *args, **kwargs):
        return self.untyped.broadcast_blob(*args, **kwargs)

    def __repr__(self):
        return f"<troupe.TypedPool {self.group.job}/{self.group.actor} of {self.spec.qualname}>"


class _Aio:
    """pool.aio.<method>(...): the method called for asyncio."""

    def __init__(self, pool):
        self._pool = pool

    def __getattr__(self, name):
        method = self._pool.spec.method(name)

        async def call(*args, idempotent=False, timeout=None, **kwargs):
            return await self._pool.call_async(method.python, *args, idempotent=idempotent,
                                               timeout=timeout, **kwargs)
        call.__name__ = name
        return call


# --- one actor -------------------------------------------------------------------------------

def connect(address, actor):
    """A handle to the actor named `actor` at `address` ("tcp://host:port", "unix:/path"): calls
    go straight to it (connecting happens on the first call). A call not marked idempotent whose
    connection breaks is sent again to the same server, which runs it once; no call is sent
    anywhere else."""
    return Ref(_troupe.Ref(address, actor))


class Ref:
    def __init__(self, impl):
        self._impl = impl

    @property
    def address(self):
        return self._impl.address

    def __repr__(self):
        return f"<troupe.Ref {self.address}>"

    def call(self, method, params=None, /, *, idempotent=False, timeout=None, **fields):
        """Calls `method` ("add" or "calc.add") and returns its results as a dict."""
        return self._impl.call(method, params, fields, idempotent, timeout, False)

    async def call_async(self, method, params=None, /, *, idempotent=False, timeout=None,
                         **fields):
        return await _call_async(self._impl, method, params, fields, idempotent, timeout, False)


# --- asyncio -----------------------------------------------------------------------------------

class _Bridge:
    """Finished work reaches an asyncio loop through a file descriptor it watches. Holds its
    loop weakly, so that a loop's bridge goes with it."""

    def __init__(self, loop):
        self.loop = weakref.ref(loop)
        self.notifier = _troupe.Notifier()
        self.waiting = {}
        self.next_token = 0
        loop.add_reader(self.notifier.fd(), self._ready)

    def wait(self, pending):
        self.next_token += 1
        token = self.next_token
        future = self.loop().create_future()
        self.waiting[token] = (future, pending)
        future.add_done_callback(lambda f: pending.cancel() if f.cancelled() else None)
        pending.notify_with(self.notifier, token)
        return future

    def _ready(self):
        for token in self.notifier.take():
            future, pending = self.waiting.pop(token)
            if future.done():
                continue
            try:
                future.set_result(pending.result())
            except Exception as e:  # troupe's errors, and what converting the results raised
                future.set_exception(e)


_bridges = weakref.WeakKeyDictionary()


def _bridge():
    loop = asyncio.get_running_loop()
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _bridges[loop] = _Bridge(loop)
    return bridge


async def _learn_schema(impl):
    # The first call learns the members' interface without blocking the asyncio loop.
    fetching = impl.fetch_schema()
    if fetching is not None:
        await _bridge().wait(fetching)


async def _call_async(impl, method, params, fields, idempotent, timeout, views):
    # With `views`, large Data in the results are memoryviews over the bytes received.
    await _learn_schema(impl)
    return await _bridge().wait(impl.start(method, params, fields, idempotent, timeout, views))
