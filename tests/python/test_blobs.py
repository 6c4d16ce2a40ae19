"""pool.broadcast_blob from Python to C++ receivers (troupe_test_blob_peer, which reports each
blob it was handed with its size and XXH3-64): every fanout, any buffer, refusals as errors."""

import os

import pytest

import troupe
from conftest import BIN_DIR, Process


@pytest.fixture(scope="module")
def receivers():
    peers = [Process([os.path.join(BIN_DIR, "troupe_test_blob_peer"), "receive"])
             for _ in range(3)]
    try:
        addresses = [p.wait_line("LISTENING ").split(" ", 1)[1] for p in peers]
        spec = ",".join(f"blobs/m-{i}={a}" for i, a in enumerate(addresses))
        group = troupe.open_resolver("fixed:" + spec).group("blobs", "m")
        group.wait_ready(3, timeout=10)
        yield group.pool(), peers
    finally:
        for p in peers:
            p.kill()


def test_a_blob_reaches_every_member_in_each_fanout(receivers):
    pool, peers = receivers
    data = bytearray(os.urandom((3 << 20) + 24))
    for version, fanout in enumerate(("star", "chain", "tree"), start=1):
        results = pool.broadcast_blob("weights", version, memoryview(data), fanout=fanout,
                                      chunk_bytes=64 << 10, window_bytes=256 << 10)
        assert [r.endpoint for r in results] == ["blobs/m-0", "blobs/m-1", "blobs/m-2"]
        assert all(r.ok for r in results), results
        assert all(r.bytes == len(data) for r in results)
        lines = {p.wait_line("RECEIVED ") for p in peers}
        assert len(lines) == 1  # the same bytes everywhere
        assert lines.pop().startswith(f"RECEIVED {version} {len(data)} ")
    # The buffer was let go of: a bytearray can be resized again.
    data.extend(b"12345678")


def test_refusals_and_bad_arguments_are_errors(receivers):
    pool, _ = receivers
    results = pool.broadcast_blob("other", 1, b"x" * 4096)
    assert [type(r.error) for r in results] == [troupe.BlobRefused] * 3
    assert "no receiver of blobs named 'other'" in str(results[0].error)
    with pytest.raises(troupe.InvalidArgument):
        pool.broadcast_blob("weights", 9, b"x", fanout="ring")
    with pytest.raises(troupe.InvalidArgument):
        pool.broadcast_blob("weights", 9, "text is not a buffer")
    with pytest.raises(troupe.InvalidArgument):
        pool.broadcast_blob("weights", 9, b"x", chunk_bytes=100)
