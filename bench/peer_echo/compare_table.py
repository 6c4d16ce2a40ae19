#!/usr/bin/env python3
"""Median table of peer-harness results with troupe's ratios to Cap'n Proto and raw TCP.

usage: compare_table.py --placement NAME FILE.jsonl [FILE.jsonl ...] [--placement NAME ...]

For each placement: the median of each metric over the runs that succeeded, per (peer,
payload, inflight); for troupe's rows, the ratio troupe / capnp and troupe / raw_tcp of the
metric that matters for that row:
  payload >= 1 MiB   MB/s        (higher is better)
  K = 1              p50 latency (lower is better)
  K > 1              calls/s     (higher is better)
Cap'n Proto cannot send 64 MiB (its fixed 64 MiB message limit); its 63 MiB row stands in for
the MB/s comparison, marked "63M". Then the targets, each marked met or missed.
"""
import json
import statistics
import sys

ORDER = ["raw_tcp", "capnp", "grpc", "grpc_async", "caf", "caf_sharing", "troupe", "troupe_pool",
         "troupe_adopt"]
TROUPE = ("troupe", "troupe_pool", "troupe_adopt")
MIB = 1 << 20

# (label, peer, payload, inflight, baseline, limit): the ratio must be <= limit for p50
# (lower is better), >= limit for the others.
TARGETS = [
    ("64 B ping-pong p50, ActorPool vs Cap'n Proto", "troupe_pool", 64, 1, "capnp", 1.0),
    ("64 B ping-pong p50, ActorPool vs raw TCP", "troupe_pool", 64, 1, "raw_tcp", 2.5),
    ("64 B ping-pong p50, ActorRef vs Cap'n Proto", "troupe", 64, 1, "capnp", 1.0),
    ("64 B, 32 in flight calls/s, ActorRef vs Cap'n Proto", "troupe", 64, 32, "capnp", 1.5),
    ("64 B, 32 in flight calls/s, ActorPool vs Cap'n Proto", "troupe_pool", 64, 32, "capnp", 1.5),
    ("1 MiB K=1 MB/s, ActorRef vs raw TCP", "troupe", MIB, 1, "raw_tcp", 0.8),
    ("1 MiB K=32 MB/s, ActorRef vs raw TCP", "troupe", MIB, 32, "raw_tcp", 0.8),
    ("64 MiB K=1 MB/s, ActorRef vs raw TCP", "troupe", 64 * MIB, 1, "raw_tcp", 0.8),
    ("64 MiB K=4 MB/s, ActorRef vs raw TCP", "troupe", 64 * MIB, 4, "raw_tcp", 0.8),
    ("1 MiB K=1 MB/s, ActorRef + adoptBytes vs raw TCP", "troupe_adopt", MIB, 1, "raw_tcp", 0.8),
    ("1 MiB K=32 MB/s, ActorRef + adoptBytes vs raw TCP", "troupe_adopt", MIB, 32, "raw_tcp", 0.8),
    ("64 MiB K=1 MB/s, ActorRef + adoptBytes vs raw TCP", "troupe_adopt", 64 * MIB, 1, "raw_tcp",
     0.8),
    ("64 MiB K=4 MB/s, ActorRef + adoptBytes vs raw TCP", "troupe_adopt", 64 * MIB, 4, "raw_tcp",
     0.8),
]


def size(n):
    for unit, f in (("MiB", MIB), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def fmt(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def metric(payload, k):
    if payload >= MIB:
        return "MBps"
    return "p50_us" if k == 1 else "calls_per_s"


def load(files):
    cells, errors = {}, {}
    for fn in files:
        with open(fn) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                key = (r["peer"], r["payload"], r["inflight"])
                if "error" in r or not r.get("calls"):
                    errors.setdefault(key, set()).add(r.get("error", "no calls")[:160])
                else:
                    cells.setdefault(key, []).append(r)
    medians = {}
    for key, rs in cells.items():
        medians[key] = {f: statistics.median(r[f] for r in rs)
                        for f in ("p50_us", "p99_us", "calls_per_s", "MBps")}
        medians[key]["runs"] = len(rs)
    return medians, errors


def baseline(medians, peer, payload, k):
    """The baseline's median row for a cell, and a note when a stand-in was used."""
    if (peer, payload, k) in medians:
        return medians[(peer, payload, k)], ""
    if peer == "capnp" and payload == 64 * MIB and k == 1 and (peer, 63 * MIB, 1) in medians:
        return medians[(peer, 63 * MIB, 1)], " (63M)"
    return None, ""


def ratio(medians, peer, payload, k, base):
    row = medians.get((peer, payload, k))
    b, note = baseline(medians, base, payload, k)
    if row is None or b is None:
        return None, ""
    m = metric(payload, k)
    return (row[m] / b[m] if b[m] else None), note


def table(name, files):
    medians, errors = load(files)
    print(f"## {name}\n\nruns: {len(files)} ({', '.join(files)})\n")
    print("| peer | payload | K | p50 µs | p99 µs | calls/s | MB/s | runs | ratio of "
          "| troupe / capnp | troupe / raw_tcp |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    key = lambda c: (c[1], c[2], ORDER.index(c[0]) if c[0] in ORDER else 99, c[0])
    for cell in sorted(medians, key=key):
        peer, payload, k = cell
        r = medians[cell]
        cols = ["", "", ""]
        if peer in TROUPE:
            cols[0] = {"MBps": "MB/s", "p50_us": "p50", "calls_per_s": "calls/s"}[metric(payload, k)]
            for i, base in enumerate(("capnp", "raw_tcp")):
                v, note = ratio(medians, peer, payload, k, base)
                cols[i + 1] = f"{v:.2f}x{note}" if v is not None else "–"
        print(f"| {peer} | {size(payload)} | {k} | {fmt(r['p50_us'])} | {fmt(r['p99_us'])} | "
              f"{r['calls_per_s']:,.0f} | {fmt(r['MBps'])} | {r['runs']} | "
              + " | ".join(cols) + " |")
    if errors:
        print("\nfailures (calls = 0):\n")
        for (peer, payload, k) in sorted(errors, key=key):
            for e in sorted(errors[(peer, payload, k)]):
                print(f"- {peer} {size(payload)} K={k}: {e}")
    print("\ntargets:\n")
    for label, peer, payload, k, base, limit in TARGETS:
        v, note = ratio(medians, peer, payload, k, base)
        if v is None:
            print(f"- {label}: no data")
            continue
        lower = metric(payload, k) == "p50_us"
        met = v <= limit if lower else v >= limit
        sign = "<=" if lower else ">="
        print(f"- {label}: {v:.2f}x{note} (target {sign} {limit}x): {'met' if met else 'MISSED'}")
    print()


def main(argv):
    groups, current = [], None
    it = iter(argv)
    for a in it:
        if a == "--placement":
            name = next(it, None)
            if name is None:
                sys.stderr.write(__doc__)
                sys.exit(2)
            current = (name, [])
            groups.append(current)
        elif a.startswith("-") or current is None:
            sys.stderr.write(__doc__)
            sys.exit(2)
        else:
            current[1].append(a)
    if not groups:
        sys.stderr.write(__doc__)
        sys.exit(2)
    for name, files in groups:
        table(name, files)


if __name__ == "__main__":
    main(sys.argv[1:])
