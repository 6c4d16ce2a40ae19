@0xd4a1f3e2c5b60791;
# What blob_bench drives its member processes with (bench_blob_member).

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::bench");

interface BlobMember {
  stats @0 () -> (peakRssBytes :UInt64, blobs :UInt64, lastBytes :UInt64, lastChecksum :UInt64);
  # Peak resident memory since the last resetPeak(), blobs handed over, and the last one's size
  # and XXH3-64 (0 unless the member runs with --verify).

  resetPeak @1 () -> ();
  # Starts measuring peak resident memory afresh (/proc/self/clear_refs).

  pull @2 (address :Text) -> (bytes :UInt64, micros :UInt64);
  # Fetches the whole blob from the BlobSource actor at `address` with one ordinary call.
}

interface BlobSource {
  fetch @0 () -> (data :Data);
  # The whole blob, in one message.
}
