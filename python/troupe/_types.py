"""How Python annotations map to Cap'n Proto types, and how values cross: each supported
annotation becomes a _Type that names its Cap'n Proto type (declaring the structs it needs in
the schema being generated) and converts values to what the extension module sends (dicts for
structs, buffers for Data) and back from what it receives.

    bool -> Bool          int -> Int64         float -> Float64      str -> Text
    bytes -> Data         list[T] -> List(T)   dict[str, T] -> List(DictOf<T>) of (key, value)
    Optional[T] -> OptionalOf<T>, a union of none and value
    a dataclass -> a struct of its fields      troupe.Tensor -> Tensor (dtype, shape, data)

Nothing is pickled: every value is checked against its type on the way out and built from
plain data on the way in.
"""

import dataclasses
import re
import sys
import types
import typing


class Tensor:
    """The annotation for an n-dimensional array: a NumPy array (or, where torch is importable,
    a CPU torch tensor) goes out as its dtype, shape and bytes, sent from the array's own memory
    when it is C-contiguous; it arrives as a NumPy array (torch.from_numpy() shares its memory).
    A contiguous array in GPU memory (a CUDA tensor, anything with __cuda_array_interface__) goes
    out copied from the GPU at its device pointer, and arrives as a NumPy array too (move it to a
    GPU with torch.from_numpy(a).cuda(); a blob, on_blob(name, device=N), lands there directly).
    Dtypes: bool, int8-64, uint8-64, float16/32/64, complex64/128."""

    def __init__(self):
        raise TypeError("troupe.Tensor is an annotation; pass a NumPy array or a torch tensor")


class AnnotationError(TypeError):
    """An annotation troupe cannot map to a Cap'n Proto type."""


# The dtypes a Tensor may carry, by the name that travels. Anything else is refused both ways:
# the name comes from the wire, and an object dtype would read pointers out of received bytes.
_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128")


def camel(name):
    """A Python name as a Cap'n Proto field or method name: max_new_tokens -> maxNewTokens."""
    head, *rest = name.strip("_").split("_")
    out = head[:1].lower() + head[1:] + "".join(p[:1].upper() + p[1:] for p in rest if p)
    return out


def type_name(name):
    """A Python class name as a Cap'n Proto type name (which starts with a capital)."""
    name = re.sub(r"[^A-Za-z0-9]", "", name)
    return name[:1].upper() + name[1:]


class Schema:
    """The struct declarations a generated schema needs, by name, in the order first used."""

    def __init__(self):
        self.structs = {}   # name -> declaration text, or None while being declared
        self.owners = {}    # name -> what declared it (a dataclass, or a description)

    def declare(self, name, owner, build):
        """Declares struct `name` once: `build()` returns its body ("a @0 :Int64; ...")."""
        if name in self.owners:
            if self.owners[name] != owner:
                raise AnnotationError(f"two types would both be the struct {name}: "
                                      f"{self.owners[name]!r} and {owner!r}; rename one")
            return name
        self.owners[name] = owner
        self.structs[name] = None  # a recursive dataclass finds itself declared
        self.structs[name] = f"struct {name} {{ {build()} }}"
        return name

    def text(self):
        return "\n".join(decl for decl in self.structs.values() if decl)


class _Type:
    name = ""       # a fragment for generated names: Int64, ListOfText
    python = ""     # how it is written in Python, for errors

    def capnp(self, schema):
        raise NotImplementedError

    def to_wire(self, value, where):
        raise NotImplementedError

    def from_wire(self, value):
        return value

    def _wrong(self, value, where):
        raise TypeError(f"{where}: expected {self.python}, got {type(value).__name__}")


class _Scalar(_Type):
    def __init__(self, python, capnp, accepts):
        self.python = python
        self.name = capnp
        self._capnp = capnp
        self._accepts = accepts

    def capnp(self, schema):
        return self._capnp

    def to_wire(self, value, where):
        if not isinstance(value, self._accepts) or (self._capnp != "Bool" and
                                                    isinstance(value, bool)):
            if not _is_numpy_scalar(value, self._capnp):
                self._wrong(value, where)
            value = value.item()
        return value


def _is_numpy_scalar(value, capnp):
    numpy = sys.modules.get("numpy")
    if numpy is None or not isinstance(value, numpy.generic):
        return False
    kinds = {"Bool": "b", "Int64": "iu", "Float64": "fiu"}
    return value.dtype.kind in kinds.get(capnp, "")


class _Bytes(_Type):
    python = "bytes"
    name = "Data"

    def capnp(self, schema):
        return "Data"

    def to_wire(self, value, where):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            self._wrong(value, where)
        return value

    def from_wire(self, value):
        return bytes(value)  # a large value arrives as a view over the message received


class _List(_Type):
    def __init__(self, item):
        self.item = item
        self.python = f"list[{item.python}]"
        self.name = f"ListOf{item.name}"

    def capnp(self, schema):
        return f"List({self.item.capnp(schema)})"

    def to_wire(self, value, where):
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
            self._wrong(value, where)
        return [self.item.to_wire(v, f"{where}[{i}]") for i, v in enumerate(value)]

    def from_wire(self, value):
        return [self.item.from_wire(v) for v in value]


class _Dict(_Type):
    def __init__(self, value):
        self.value = value
        self.python = f"dict[str, {value.python}]"
        self.name = f"DictOf{value.name}"

    def capnp(self, schema):
        entry = schema.declare(self.name, self.python, lambda: (
            f"key @0 :Text; value @1 :{self.value.capnp(schema)};"))
        return f"List({entry})"

    def to_wire(self, value, where):
        if not isinstance(value, dict):
            self._wrong(value, where)
        out = []
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: keys must be str, got {type(k).__name__}")
            out.append({"key": k, "value": self.value.to_wire(v, f"{where}[{k!r}]")})
        return out

    def from_wire(self, value):
        return {e["key"]: self.value.from_wire(e["value"]) for e in value}


class _Optional(_Type):
    def __init__(self, inner):
        self.inner = inner
        self.python = f"Optional[{inner.python}]"
        self.name = f"OptionalOf{inner.name}"

    def capnp(self, schema):
        return schema.declare(self.name, self.python, lambda: (
            f"union {{ none @0 :Void; value @1 :{self.inner.capnp(schema)}; }}"))

    def to_wire(self, value, where):
        if value is None:
            return {"none": None}
        return {"value": self.inner.to_wire(value, where)}

    def from_wire(self, value):
        if "value" in value:
            return self.inner.from_wire(value["value"])
        return None


class _Dataclass(_Type):
    def __init__(self, cls):
        self.cls = cls
        self.python = cls.__qualname__
        self.name = type_name(cls.__name__)
        self.fields = None  # (python name, capnp name, _Type), resolved on first use

    def _resolve(self):
        if self.fields is None:
            self.fields = []
            hints = _hints(self.cls, f"dataclass {self.cls.__qualname__}")
            for f in dataclasses.fields(self.cls):
                if f.name not in hints:
                    raise AnnotationError(f"dataclass {self.cls.__qualname__}: field '{f.name}' "
                                          "has no annotation")
                self.fields.append((f.name, camel(f.name),
                                    of(hints[f.name], f"dataclass {self.cls.__qualname__}, "
                                                      f"field '{f.name}'")))
            _check_unique([c for _, c, _ in self.fields], f"dataclass {self.cls.__qualname__}")
        return self.fields

    def capnp(self, schema):
        def body():
            return " ".join(f"{c} @{i} :{t.capnp(schema)};"
                            for i, (_, c, t) in enumerate(self._resolve()))
        return schema.declare(self.name, self.cls, body)

    def to_wire(self, value, where):
        if not isinstance(value, self.cls):
            self._wrong(value, where)
        return {c: t.to_wire(getattr(value, p), f"{where}.{p}") for p, c, t in self._resolve()}

    def from_wire(self, value):
        return self.cls(**{p: t.from_wire(value[c]) for p, c, t in self._resolve()})


class _Tensor(_Type):
    python = "troupe.Tensor"
    name = "Tensor"

    def capnp(self, schema):
        return schema.declare("Tensor", "troupe.Tensor",
                              lambda: "dtype @0 :Text; shape @1 :List(Int64); data @2 :Data;")

    def to_wire(self, value, where):
        numpy = _numpy(where)
        if type(value).__module__.split(".")[0] == "torch" and value.device.type == "cuda":
            value = value.detach()  # a tensor that requires grad shows no array interface
        if hasattr(value, "__cuda_array_interface__"):
            return self._from_device(value.__cuda_array_interface__, numpy, where)
        if type(value).__module__.split(".")[0] == "torch":
            if value.device.type != "cpu":
                raise TypeError(f"{where}: a torch tensor on {value.device} (send a CPU tensor: "
                                ".cpu())")
            value = value.detach().numpy()
        if not isinstance(value, numpy.ndarray):
            self._wrong(value, where)
        if value.dtype.name not in _DTYPES:
            raise TypeError(f"{where}: a tensor's dtype must be one of {', '.join(_DTYPES)}, "
                            f"not {value.dtype}")
        if not value.dtype.isnative:
            value = value.astype(value.dtype.newbyteorder("="))
        if not value.flags.c_contiguous:
            value = value.copy(order="C")  # else sent from the array's own memory
        data = value.reshape(-1).view(numpy.uint8) if value.size else b""
        return {"dtype": value.dtype.name, "shape": list(value.shape), "data": data}

    def _from_device(self, cai, numpy, where):
        """A tensor in GPU memory (its __cuda_array_interface__), copied out for the message."""
        from . import _troupe
        dtype = numpy.dtype(cai["typestr"])
        if dtype.name not in _DTYPES:
            raise TypeError(f"{where}: a tensor's dtype must be one of {', '.join(_DTYPES)}, "
                            f"not {dtype}")
        shape = [int(n) for n in cai["shape"]]
        strides = cai.get("strides")
        if strides is not None:
            expected = dtype.itemsize
            for n, stride in reversed(list(zip(shape, strides))):
                if n != 1 and stride != expected:
                    raise TypeError(f"{where}: a tensor in GPU memory must be contiguous "
                                    "(.contiguous())")
                expected *= n
        count = 1
        for n in shape:
            count *= n
        data = numpy.empty(count * dtype.itemsize, dtype=numpy.uint8)
        if data.size:
            _troupe.copy_from_device(data, cai["data"][0], data.size, cai.get("stream"))
        if not dtype.isnative:
            data = data.view(dtype).astype(dtype.newbyteorder("=")).view(numpy.uint8)
            dtype = dtype.newbyteorder("=")
        return {"dtype": dtype.name, "shape": shape, "data": data}

    def from_wire(self, value):
        numpy = _numpy("a received troupe.Tensor")
        dtype, shape, data = value["dtype"], value["shape"], value["data"]
        if dtype not in _DTYPES:
            raise ValueError(f"a received tensor has dtype '{dtype}', which troupe does not send")
        dtype = numpy.dtype(dtype)
        count = 1
        for n in shape:
            if n < 0:
                raise ValueError(f"a received tensor has shape {shape}")
            count *= n
        if count * dtype.itemsize != len(data):
            raise ValueError(f"a received tensor of shape {shape} and dtype {dtype} holds "
                             f"{len(data)} bytes, not {count * dtype.itemsize}")
        array = numpy.frombuffer(data, dtype=dtype)
        if isinstance(data, bytes):
            array = array.copy()  # small: writable like a large one, which is a view (toPython)
        return array.reshape(shape)


def _numpy(where):
    try:
        import numpy
    except ImportError:
        raise TypeError(f"{where}: troupe.Tensor needs NumPy (python3-numpy)") from None
    return numpy


_SCALARS = {
    bool: _Scalar("bool", "Bool", bool),
    int: _Scalar("int", "Int64", int),
    float: _Scalar("float", "Float64", (float, int)),
    str: _Scalar("str", "Text", str),
    bytes: _Bytes(),
}
_SUPPORTED = ("bool, int, float, str, bytes, list[T], dict[str, T], Optional[T], a dataclass "
              "or troupe.Tensor")


def of(annotation, where):
    """The _Type for `annotation`; AnnotationError naming `where` and what to write instead for
    an annotation troupe cannot map."""
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if annotation is Tensor:
        return _Tensor()
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _Dataclass(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list and len(args) == 1:
        return _List(of(args[0], where))
    if origin is dict and len(args) == 2:
        if args[0] is not str:
            raise AnnotationError(f"{where}: dict keys must be str (dict[str, T]), not "
                                  f"{_show(args[0])}")
        return _Dict(of(args[1], where))
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return _Optional(of(rest[0], where))
        raise AnnotationError(f"{where}: {_show(annotation)} is a union; only Optional[T] "
                              f"(T | None) is supported")
    if annotation in (list, dict):
        raise AnnotationError(f"{where}: {_show(annotation)} needs its item type: write "
                              f"{'list[int]' if annotation is list else 'dict[str, float]'}, "
                              "say")
    hint = ""
    if annotation is typing.Any or annotation is object:
        hint = " (nothing is pickled: say what the value is)"
    raise AnnotationError(f"{where}: {_show(annotation)} is not supported{hint}; use {_SUPPORTED}")


def _show(annotation):
    if isinstance(annotation, type):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _hints(obj, where):
    try:
        return typing.get_type_hints(obj)
    except Exception as e:  # a name the annotations use that does not resolve
        raise AnnotationError(f"{where}: its annotations do not resolve: {e}") from None


def _check_unique(names, where):
    seen = set()
    for n in names:
        if n in seen:
            raise AnnotationError(f"{where}: two names become '{n}' in the schema; rename one")
        seen.add(n)
