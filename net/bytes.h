#pragma once
// Large byte payloads (tensors, blobs) sent without being copied into the message.
//
//   auto q = ps.pushRequest();
//   kj::Array<const kj::byte> gradient = ...;   // or kj::ArrayPtr(...).attach(kj::mv(owner))
//   troupe::adoptBytes(q, &PushParams::Builder::adoptGradient, kj::mv(gradient));
//   return q.send();

#include <stdint.h>
#include <string.h>

#include <capnp/any.h>
#include <capnp/orphan.h>
#include <kj/array.h>

#include "troupe/base/buffer_cache.h"

namespace troupe {

// Hands `bytes` to the outgoing RPC message whose memory holds `address` (a struct of that
// message), which then owns them until it has been written or dropped: what adoptBytes() and the
// Python module's buffers do before pointing a Data field at memory of their own. Returns false,
// leaving `bytes` alone, when no message about to go over an RPC connection on this thread holds
// `address`. Loop thread only.
bool attachToOutgoingMessage(const void* address, kj::Array<const kj::byte>& bytes);

// An outgoing RPC message kept after it was sent (retainOutgoingMessage()).
struct RetainedMessage {
  kj::Own<void> holder;  // keeps the message's memory, unchanged, while it lives; loop thread
  size_t bytes;          // the memory it holds
};

// Keeps the outgoing RPC message whose memory holds `address` (a struct of that message), so that
// what was built in it can still be read once it has been sent, without a copy: what an
// exactly-once call's reply cache keeps of a large reply. The message is no longer offered to
// attachToOutgoingMessage(). Null when no message about to go over an RPC connection on this
// thread holds `address`, or when that message holds memory attached to it (adoptBytes()), which
// its owner was promised back once the message is written. Loop thread only.
kj::Maybe<RetainedMessage> retainOutgoingMessage(const void* address);

// Received bytes at least this large are kept rather than copied (keepReceivedBytes()): the
// messages whose memory comes from the buffer cache (buffer_cache.h). Smaller ones are cheaper
// to copy than to look up.
constexpr size_t KEPT_RECEIVED_MIN_BYTES = CACHED_BUFFER_MIN_BYTES;

// The bytes of `data`, a Data value read from a large message troupe received over an RPC
// connection (a call's parameters an actor serves, a response), kept valid beyond the message: a
// receiver that keeps a large payload (a tensor an actor stores) need not copy it. The array
// holds the whole message's memory until it is dropped, on any thread. Writing through it is
// safe (the memory is this process's own) but the message's readers see what was written.
// Keeping any part keeps the whole message's memory. Returns null, and the caller copies, when
// `data` is empty or lies in no received message of at least KEPT_RECEIVED_MIN_BYTES that is
// still held (a message built in this process, an in-process call, a small message), or in the
// part of a message a SegmentPlacement gave its memory for (a blob chunk). Any thread.
kj::Maybe<kj::Array<kj::byte>> keepReceivedBytes(kj::ArrayPtr<const kj::byte> data);

// Sets the Data field that `adopt` (a generated `adoptXxx` method of struct builder `M`) adopts
// on `builder` to `bytes`.
//
// When `builder` belongs to a message troupe is about to send over an RPC connection (a
// request, or the results of a call an actor is serving), and `bytes` starts on an 8-byte
// boundary with a size that is a multiple of 8, the message points at `bytes` instead of
// copying them, and owns `bytes` from then on: it frees them once it has been written to the
// socket, or dropped. That can be after the call has settled (a call that timed out may still
// be sending), which is why the bytes must be owned by the message rather than borrowed.
// Returns true then. Otherwise the bytes are copied, `bytes` is dropped at once, and it returns
// false: for an in-process call, a message of your own, unaligned or ragged bytes, and a
// request made before its ActorRef has connected and found the actor (such a request waits in
// this process and is copied when it leaves). The bytes
// must not change until they are freed.
template <typename B, typename M>
bool adoptBytes(B& builder, void (M::*adopt)(capnp::Orphan<capnp::Data>&&),
                kj::Array<const kj::byte> bytes) {
  M& target = builder;
  auto orphanage = capnp::Orphanage::getForMessageContaining(target);
  bool aligned = reinterpret_cast<uintptr_t>(bytes.begin()) % sizeof(capnp::word) == 0 &&
                 bytes.size() % sizeof(capnp::word) == 0 && bytes.size() > 0;
  if (aligned) {
    // The struct's own location tells which message it is in.
    const void* at = capnp::AnyStruct::Builder(M(target)).getDataSection().begin();
    kj::ArrayPtr<const kj::byte> view = bytes;
    if (attachToOutgoingMessage(at, bytes)) {
      (target.*adopt)(orphanage.referenceExternalData(view));
      return true;
    }
  }
  auto copy = orphanage.template newOrphan<capnp::Data>(bytes.size());
  if (bytes.size() > 0) memcpy(copy.get().begin(), bytes.begin(), bytes.size());
  (target.*adopt)(kj::mv(copy));
  return false;
}

}  // namespace troupe
