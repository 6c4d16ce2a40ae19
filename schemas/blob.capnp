@0xb7c1d2a4e5f60718;
# Streamed transfers of large byte blobs (weights, tensors) between troupe processes, and their
# forwarding from member to member in a broadcast. Stable: fields are only ever added, at new
# ordinals.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

struct BlobHeader {
  name @0 :Text;          # what the blob is ("weights"): the receiver's acceptBlobs() name
  version @1 :UInt64;     # the sender's version of it; receivers refuse versions they have
  size @2 :UInt64;        # bytes in the blob
  transfer @3 :UInt64;    # random id of this send, the same at every hop of a broadcast
  chunkBytes @4 :UInt32;  # every chunk holds this many bytes but the last
  windowBytes @5 :UInt64; # bytes a hop keeps in flight to the next one
  stallMillis @6 :UInt32; # a hop that makes no progress this long is given up
  deviceMemory @7 :Data;  # the blob in the sender's device memory, exported for processes on
                          # its host (BlobDevice::exportMemory, e.g. a CUDA IPC handle); sent
                          # only to a member reached through its same-host socket, else empty
  deviceHost @8 :Text;    # the sender's sameHostId(): a receiver on that host whose own memory
                          # is on a device that can open deviceMemory may copy the chunks from
                          # there device to device (ActorHost.receiveBlob's `pulls`)
  senderPid @9 :UInt32;     # the sender's process id, where its blob is in host memory and it
                            # lets members on its host read it (BlobSendOptions::sameHostReads);
                            # sent only to a member reached through its same-host socket, else 0.
                            # A receiver whose memory is host memory, whose client on the
                            # connection is that very process (SO_PEERCRED) and that the kernel
                            # lets read it (process_vm_readv) copies the chunks from there
                            # (ActorHost.receiveBlob's `pulls`)
  senderMemory @10 :UInt64; # the address of the blob's first byte in that process
  sameHostReads @11 :Bool;  # the sender's BlobSendOptions::sameHostReads, which members that
                            # forward the blob apply to their own memory
}

struct BlobHop {
  # A member a receiver forwards the blob to. Hops travel as a flat list in which parents come
  # before their children (a nested tree would pass Cap'n Proto's nesting limit for long chains).
  endpoint @0 :Text;       # the member's endpoint name, for outcomes
  address @1 :Text;        # where its server listens
  parent @2 :Int32;        # index of the hop that forwards to this one; -1: the receiver itself
  sameHostSocket @3 :Text; # its server's same-host unix socket, if it publishes one ("troupe.unix")
  sameHostId @4 :Text;     # and the host that socket is on ("troupe.host"): a hop on that host
                           # connects there (actor/endpoint.h, connectAddress())
}

struct BlobOutcome {
  # What became of the blob at one member.
  endpoint @0 :Text;
  ok @1 :Bool;             # the member has the whole blob, checked, and handed it over
  error @2 :Text;          # why not: a description as errors.h describes errors
  errorType @3 :UInt8;     # the error's kj::Exception::Type
  bytes @4 :UInt64;        # bytes the member received
  micros @5 :UInt64;       # from its first request to having the whole blob, on its clock
  pulled @6 :UInt64;       # of `bytes`, those it copied from its senders' memory (the header's
                           # deviceMemory or senderMemory: `pulled` writes), not received in
                           # writes
}

interface BlobSink {
  # One hop of a transfer: what its sender writes into. A receiver takes writes from the sink it
  # handed out last for a transfer; one handed out earlier (to a sender since replaced by another
  # that resumed the transfer) is superseded: its writes are dropped and say so, its finish()
  # reports nothing, its abort() does nothing. Dropping a sink without finish() leaves the
  # receiver waiting for another sender to resume the transfer until its idle timeout.

  write @0 (offset :UInt64, data :Data, checksum :UInt64, transfer :UInt64, pulled :Bool,
            heldUntil :Int64) -> (superseded :Bool);
  # The chunk at `offset` (the receiver's next byte); `checksum` is the chunk's XXH3-64,
  # `transfer` the header's. A receiver may read a chunk sent as its message's own last segment
  # (Orphanage::referenceExternalData) straight into its place in the blob, found by `transfer`
  # and `offset` before the rest of the message is read. With `pulled` (only to a receiver that
  # said it `pulls`), the chunk is not in `data` (empty; `checksum` 0): it is in place at `offset`
  # in the header's deviceMemory (copied from there device to device) or in the sender's own
  # memory (senderMemory, read by the kernel), and the receiver copies it before it answers. A
  # receiver that read the sender's memory hands the blob over at finish(), once the sender has
  # had every answer while holding its memory, not at the last chunk. `heldUntil`, for a chunk
  # so read: the sender's CLOCK_MONOTONIC (ns) until which it holds that memory, whatever becomes
  # of the transfer (the stall timeout past the write); a read that ends later is not taken.

  finish @1 () -> (outcomes :List(BlobOutcome), superseded :Bool);
  # After the last chunk: resolves once this member has handed the blob over and every member
  # it forwards to has finished, with an outcome for each of them (this member's first).

  abort @2 (reason :Text) -> ();
  # Gives the transfer up here and at every member this one forwards to.
}
