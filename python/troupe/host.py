"""A replica that hosts one troupe.actor class, as launcher.create_actor_group() starts it:

    python3 -m troupe.host MODULE:CLASS --name NAME [--max-concurrency N] [--listen ADDRESS]

imports CLASS from MODULE, builds it from the constructor arguments its launcher put in
TROUPE_ACTOR_ARGS (JSON, checked against its __init__'s annotations), and hosts it as actor NAME
of the job the environment names until SIGTERM (or Ctrl-C) drains it. Once it serves, it prints
"SERVING <address>" on stdout, and "STOPPED" once drained. Exits 1, with the reason
on stderr, when the class cannot be imported or built, or the replica cannot start."""

import argparse
import importlib
import sys
import traceback

import troupe
from troupe import _actors


def _load(target):
    module_name, sep, qualname = target.partition(":")
    if not sep or not module_name or not qualname:
        raise SystemExit(f"troupe.host: '{target}' is not MODULE:CLASS")
    if module_name == "__main__":
        raise SystemExit("troupe.host: a class in __main__ cannot be imported by a replica; "
                         "move it to a module of its own")
    module = importlib.import_module(module_name)
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise SystemExit(f"troupe.host: module '{module_name}' has no '{qualname}'")
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m troupe.host")
    parser.add_argument("target", help="MODULE:CLASS")
    parser.add_argument("--name", required=True, help="the actor's name")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--listen", default="", help="the address to listen on")
    options = parser.parse_args(argv)
    try:
        cls = _load(options.target)
        spec = _actors.spec_of(cls)
        obj = troupe._construct(spec)
        hosted = troupe.host_actor(obj, name=options.name,
                                   max_concurrency=options.max_concurrency,
                                   listen=options.listen)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        return 1
    print(f"SERVING {hosted.address}", flush=True)
    try:
        hosted.wait()
    except KeyboardInterrupt:
        hosted.stop()
        hosted.wait()
    print("STOPPED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
