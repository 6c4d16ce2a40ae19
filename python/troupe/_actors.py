"""Python classes as actors: @troupe.actor reads a class's public methods and their annotations
into an ActorSpec, which generates the Cap'n Proto interface they make (parsed at run time, as
serve() parses a hand-written one), serves an instance through it (host_actor), and calls it
with Python values (TypedPool). See _types.py for how annotations map."""

import asyncio
import dataclasses
import hashlib
import inspect
import threading

from . import _types
from ._types import AnnotationError, camel, type_name


@dataclasses.dataclass
class Param:
    python: str      # "max_tokens"
    capnp: str       # "maxTokens"
    type: object     # a _types._Type
    default: object  # inspect.Parameter.empty when required


@dataclasses.dataclass
class Method:
    python: str
    capnp: str
    params: list
    result: object   # a _types._Type, or None for a method that returns None
    is_async: bool
    signature: inspect.Signature


def _params(fn, where, skip_self=True):
    sig = inspect.signature(fn)
    hints = _types._hints(fn, where)
    out = []
    for i, p in enumerate(sig.parameters.values()):
        if skip_self and i == 0:
            continue
        at = f"{where}, parameter '{p.name}'"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise AnnotationError(f"{at}: *args and **kwargs cannot be typed; name each "
                                  "parameter")
        if p.kind is p.POSITIONAL_ONLY:
            raise AnnotationError(f"{at}: positional-only parameters cannot be named in a "
                                  "call; drop the '/'")
        if p.name not in hints:
            raise AnnotationError(f"{at} has no annotation: write '{p.name}: int' (or the "
                                  f"type it takes: {_types._SUPPORTED})")
        out.append(Param(p.name, camel(p.name), _types.of(hints[p.name], at), p.default))
    _types._check_unique([p.capnp for p in out], where)
    return out, sig, hints


class ActorSpec:
    """What a class looks like as an actor: its methods, their parameters and results, and the
    Cap'n Proto schema text they make. Raises AnnotationError for what cannot be typed."""

    def __init__(self, cls):
        if not isinstance(cls, type):
            raise TypeError(f"troupe.actor takes a class, not {type(cls).__name__}")
        self.cls = cls
        self.module = cls.__module__
        self.qualname = cls.__qualname__
        self.interface = type_name(cls.__name__)
        self.methods = {}
        self.blob_handlers = {}  # blob name -> the method (its Python name) that takes it
        self.blob_devices = {}  # blob name -> the CUDA device it is received into, if any
        for name in _public_methods(cls):
            fn = inspect.getattr_static(cls, name)
            if isinstance(fn, (staticmethod, classmethod)):
                continue
            where = f"{cls.__qualname__}.{name}"
            blob = getattr(fn, BLOB_ATTRIBUTE, None)
            if blob is not None:
                blob, device = blob
                self._add_blob_handler(blob, name, fn, where)
                if device is not None:
                    self.blob_devices[blob] = device
                continue
            params, sig, hints = _params(fn, where)
            if "return" not in hints:
                raise AnnotationError(f"{where} has no return annotation: write '-> int' (or "
                                      "what it returns), or '-> None'")
            returned = hints["return"]
            result = None if returned is type(None) else _types.of(returned, f"{where}, result")
            self.methods[name] = Method(name, camel(name), params, result,
                                        inspect.iscoroutinefunction(fn), sig)
        _types._check_unique([m.capnp for m in self.methods.values()], cls.__qualname__)
        init = cls.__init__
        if init is object.__init__:
            self.init_params = []
        else:
            self.init_params, _, _ = _params(init, f"{cls.__qualname__}.__init__")
        self.has_async = any(m.is_async for m in self.methods.values())
        self.schema_text = self._schema()
        self.file_name = f"troupe-python/{self.module}/{self.qualname}.capnp"

    def _schema(self):
        schema = _types.Schema()
        lines = []
        for i, m in enumerate(self.methods.values()):
            params = ", ".join(f"{p.capnp} :{p.type.capnp(schema)}" for p in m.params)
            results = f"value :{m.result.capnp(schema)}" if m.result else ""
            lines.append(f"  {m.capnp} @{i} ({params}) -> ({results});")
        # A stable id: the same class in the same module always makes the same schema id.
        digest = hashlib.sha256(f"troupe.actor:{self.module}:{self.qualname}".encode()).digest()
        file_id = int.from_bytes(digest[:8], "big") | (1 << 63)
        if schema.owners.get(self.interface) is not None:
            raise AnnotationError(f"{self.qualname}: a type it uses is also named "
                                  f"{self.interface}; rename one")
        body = "\n".join(lines)
        return (f"@0x{file_id:016x};\n{schema.text()}\n"
                f"interface {self.interface} {{\n{body}\n}}\n")

    def _add_blob_handler(self, blob, name, fn, where):
        if blob in self.blob_handlers:
            raise AnnotationError(f"{where}: blob '{blob}' is taken already by "
                                  f"{self.qualname}.{self.blob_handlers[blob]}")
        if inspect.iscoroutinefunction(fn):
            raise AnnotationError(f"{where}: a blob handler runs between calls; make it a plain "
                                  "'def'")
        params = list(inspect.signature(fn).parameters)
        if len(params) != 3:
            raise AnnotationError(f"{where}: a blob handler takes (self, version, data), not "
                                  f"({', '.join(params)})")
        self.blob_handlers[blob] = name

    def method(self, name):
        """The Method called `name` (its Python name, or the schema's)."""
        m = self.methods.get(name)
        if m is None:
            for candidate in self.methods.values():
                if candidate.capnp == name:
                    return candidate
            known = ", ".join(self.methods) or "none"
            raise AttributeError(f"{self.qualname} has no method '{name}' (its methods: {known})")
        return m

    def request(self, method, args, kwargs):
        """The parameters of a call of `method` with these arguments, as the wire takes them."""
        try:
            bound = method.signature.bind(None, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.qualname}.{method.python}: {e}") from None
        bound.apply_defaults()
        given = bound.arguments
        return {p.capnp: p.type.to_wire(given[p.python], f"{self.qualname}.{method.python}, "
                                                         f"parameter '{p.python}'")
                for p in method.params}

    def arguments(self, method, wire):
        """The keyword arguments for `method` from the parameters received."""
        return {p.python: p.type.from_wire(wire[p.capnp]) for p in method.params
                if p.capnp in wire}

    def result(self, method, wire):
        """What a call of `method` returned, from its results received."""
        if method.result is None:
            return None
        return method.result.from_wire(wire["value"])

    def __repr__(self):
        return f"<troupe.ActorSpec {self.module}.{self.qualname}: {', '.join(self.methods)}>"


# Where troupe.on_blob() marks a method: the blob name it takes.
BLOB_ATTRIBUTE = "__troupe_blob__"


def on_blob(name, device=None):
    """Marks a method of a troupe.actor class as what takes blob `name` (see troupe.on_blob)."""
    if not isinstance(name, str) or not name:
        raise TypeError("troupe.on_blob takes the blob's name, a non-empty str")
    if device is not None and (isinstance(device, bool) or not isinstance(device, int) or
                               device < 0):
        raise TypeError("troupe.on_blob's device is a CUDA device's number (0, 1, ...) or None")

    def mark(fn):
        if not callable(fn):
            raise TypeError("troupe.on_blob marks a method")
        setattr(fn, BLOB_ATTRIBUTE, (name, device))
        return fn
    return mark


def _public_methods(cls):
    seen = []
    for klass in reversed(cls.__mro__[:-1]):  # object's last: base classes' methods first
        for name, value in vars(klass).items():
            if name in seen or (name.startswith("_") and
                                getattr(value, BLOB_ATTRIBUTE, None) is None):
                continue
            if callable(value) or isinstance(value, (staticmethod, classmethod)):
                seen.append(name)
    return seen


def spec_of(cls):
    """The ActorSpec of `cls`, made once (at decoration by @troupe.actor)."""
    spec = cls.__dict__.get("__troupe_actor__")
    if spec is None:
        spec = ActorSpec(cls)
        try:
            cls.__troupe_actor__ = spec
        except (AttributeError, TypeError):  # a class that refuses attributes: made each time
            pass
    return spec


# --- serving ------------------------------------------------------------------------------------

class _AsyncLoop:
    """An asyncio loop on a thread of its own, where a replica's async methods run."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="troupe-asyncio",
                                       daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Servant:
    """What the extension module serves for an instance of a troupe.actor class: one method per
    schema method, taking the parameters received as keyword arguments and returning the results
    to send. Sync methods of a class with async methods run one at a time, under a lock, as
    they would on the serving thread."""

    def __init__(self, spec, obj):
        self._spec = spec
        self._obj = obj
        self._async = _AsyncLoop() if spec.has_async else None
        self._lock = threading.Lock() if spec.has_async else None
        for m in spec.methods.values():
            setattr(self, m.capnp, self._bind(m))

    def _bind(self, method):
        fn = getattr(self._obj, method.python)
        spec = self._spec

        def call(**wire):
            args = spec.arguments(method, wire)
            if method.is_async:
                value = self._async.run(fn(**args))
            elif self._lock is not None:
                with self._lock:
                    value = fn(**args)
            else:
                value = fn(**args)
            if method.result is None:
                return None
            where = f"{spec.qualname}.{method.python}, its result"
            return {"value": method.result.to_wire(value, where)}

        call.__name__ = method.capnp
        return call

    def take_blob(self, name, version, data):
        """Hands blob `name` at `version` (`data`, a read-only memoryview over the bytes
        received, or a troupe.DeviceArray for a blob received into a GPU) to the method marked
        to take it, as a sync method runs."""
        fn = getattr(self._obj, self._spec.blob_handlers[name])
        if self._lock is not None:
            with self._lock:
                fn(version, data)
        else:
            fn(version, data)

    def close(self):
        if self._async is not None:
            self._async.close()
