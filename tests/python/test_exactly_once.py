"""Calls not marked idempotent run once across broken connections (README, "Errors and
retries"): test servers behind troupe_test_fault_proxy, which cuts their connections where it
is told or at random (seeded), each started on port 0 and stopped by pid."""

import os
import signal

from conftest import BIN_DIR, Process

import troupe

CALLS = 600


def start_server():
    server = Process([os.path.join(BIN_DIR, "troupe_test_server")])
    return server, server.wait_line("LISTENING ").split(" ")[1]


def start_proxy(target, *flags):
    proxy = Process([os.path.join(BIN_DIR, "troupe_test_fault_proxy"), target, *flags])
    return proxy, proxy.wait_line("LISTENING ").split(" ")[1]


def stop_proxy(proxy):
    """Stops `proxy` and returns how many connections it cut."""
    proxy.kill(signal.SIGTERM)
    cut = int(proxy.wait_line("STATS ").split(" ")[2])
    return cut


def calls_run(address):
    """How many times the member at `address` ran whoami, asked without a proxy."""
    return troupe.connect(address, "member").call("member.calls", idempotent=True)["count"]


def test_a_call_whose_reply_was_cut_gets_it_without_running_again():
    server, address = start_server()
    proxy, proxied = start_proxy(address, "--cut-once-call", "before-reply")
    try:
        ref = troupe.connect(proxied, "member")
        assert ref.call("member.whoami", timeout=10)["name"] == "test/member-0"
        assert stop_proxy(proxy) == 1
        assert calls_run(address) == 1
    finally:
        proxy.kill()
        server.kill()


def test_a_pool_under_random_cuts_runs_every_call_once():
    servers, proxies = [], []
    try:
        members = []
        for i in range(3):
            server, address = start_server()
            servers.append((server, address))
            proxy, proxied = start_proxy(address, "--random", str(7 + i), "10")
            proxies.append(proxy)
            members.append(f"test/member-{i}={proxied}")
        group = troupe.open_resolver("fixed:" + ",".join(members)).group("test", "member")
        group.wait_ready(3, timeout=30)
        pool = group.pool()
        for _ in range(CALLS):
            pool.call("member.whoami", timeout=30)
        cuts = sum(stop_proxy(p) for p in proxies)
        assert cuts > 0, "the proxies cut no connection: the test tested nothing"
        assert sum(calls_run(address) for _, address in servers) == CALLS
    finally:
        for p in proxies:
            p.kill()
        for s, _ in servers:
            s.kill()
