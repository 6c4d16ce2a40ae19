"""The Python module reads troupe's environment as C++ programs do: with TROUPE_TLS_* and
TROUPE_TOKEN_FILE set, it finds a TLS registry and calls C++ replicas over TLS; without the token
it is refused as Unauthenticated. Certificates come from scripts/make_certs.sh (openssl); every
process runs with the environment of its own, started and stopped by pid."""

import os
import signal
import subprocess
import sys

import pytest

from conftest import BIN_DIR, Job, Process

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")

CLIENT = r"""
import sys, troupe
group = troupe.open_resolver().group("tlscalc", "calc")
try:
    group.wait_ready(2, timeout=30)
    pool = group.pool()
    print(pool.call("calc.add", a=40, b=2)["value"])
    print(sorted(m["address"].split(":")[0] for m in group.members()))
except troupe.Error as e:
    print(type(e).__name__, e.code)
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """The environment of a cluster with TLS and a token, and its registry's URL in it."""
    certs = tmp_path_factory.mktemp("certs")
    subprocess.run([os.path.join(SCRIPTS, "make_certs.sh"), str(certs)], check=True,
                   capture_output=True)
    token = certs / "token"
    token.write_text(os.urandom(32).hex())
    token.chmod(0o600)
    env = dict(os.environ, TROUPE_TLS_CA=str(certs / "ca.pem"),
               TROUPE_TLS_CERT=str(certs / "node.pem"), TROUPE_TLS_KEY=str(certs / "node.key"),
               TROUPE_TOKEN_FILE=str(token))
    registry = Process([os.path.join(BIN_DIR, "troupe"), "registry", "--listen",
                        "tls://127.0.0.1:0"], env)
    try:
        address = registry.wait_line("LISTENING ").split(" ", 1)[1]
        assert address.startswith("tls://")
        env["TROUPE_RESOLVER"] = "registry+tls://" + address[len("tls://"):]
        job = Job(env["TROUPE_RESOLVER"], "tlscalc", "calculator_server", 2,
                  "calculator serving at ", env)
        try:
            yield env
        finally:
            job.stop()
    finally:
        registry.kill(signal.SIGTERM)


def run_client(env):
    out = subprocess.run([sys.executable, "-c", CLIENT], env=env, capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_python_calls_cpp_replicas_over_tls_with_the_token(secured):
    assert run_client(secured) == ["42.0", "['tls', 'tls']"]


def test_without_the_token_python_is_refused_as_unauthenticated(secured):
    env = dict(secured)
    del env["TROUPE_TOKEN_FILE"]
    assert run_client(env) == ["Unauthenticated unauthenticated"]


CLIENT_WITH_ARGUMENTS = r"""
import sys, troupe
url, token, ca, cert, key = sys.argv[1:]
try:
    resolver = troupe.open_resolver(url, token_file=token, tls_ca=ca, tls_cert=cert, tls_key=key)
    group = resolver.group("tlscalc", "calc")
    group.wait_ready(2, timeout=30)
    print(sorted(e["name"] for e in resolver.ls("tlscalc/")))
    pool = group.pool()
    print(pool.call("calc.add", a=40, b=2)["value"])
    # The blob reaches each member over TLS with the token, whose server takes no blobs.
    sent = pool.broadcast_blob("weights", 1, b"x" * 4096)
    print(sorted({type(r.error).__name__ for r in sent}))
except troupe.Error as e:
    print(type(e).__name__, e.code, str(e).replace(token, "TOKEN_FILE"))
"""


def run_client_with_arguments(secured, token_file):
    # Nothing of the cluster's in the environment: the credentials are arguments.
    env = {k: v for k, v in secured.items() if not k.startswith("TROUPE_")}
    args = [secured["TROUPE_RESOLVER"], token_file, secured["TROUPE_TLS_CA"],
            secured["TROUPE_TLS_CERT"], secured["TROUPE_TLS_KEY"]]
    out = subprocess.run([sys.executable, "-c", CLIENT_WITH_ARGUMENTS, *args], env=env,
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_open_resolver_takes_the_credentials_as_arguments(secured):
    assert run_client_with_arguments(secured, secured["TROUPE_TOKEN_FILE"]) == [
        "['tlscalc/calc-0', 'tlscalc/calc-1']", "42.0", "['BlobRefused']"]


def test_a_missing_token_file_given_to_open_resolver_is_named(secured, tmp_path):
    missing = str(tmp_path / "no-such-token")
    [line] = run_client_with_arguments(secured, missing)
    assert line.startswith("InvalidArgument invalid_argument")
    assert "TOKEN_FILE" in line  # the file is named
