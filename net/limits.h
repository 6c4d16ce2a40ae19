#pragma once
// Size limits on what crosses the wire, and bounds on what peers can make a server hold.

#include <cstdint>

#include <kj/exception.h>
#include <kj/time.h>

namespace troupe {

// The largest Cap'n Proto message (request or response, payload plus framing) a troupe
// connection accepts unless its options say otherwise: 512 MiB, so a 256 MiB tensor fits with
// room to spare. Both ends must agree: each side refuses to send a message over its own limit
// (only that call fails, with MESSAGE_TOO_LARGE), and a side that receives one over its limit
// closes that connection (its other connections keep serving). A receiver allocates at most
// this much for a message before reading it.
constexpr uint64_t DEFAULT_MAX_MESSAGE_BYTES = uint64_t{512} << 20;

// The MESSAGE_TOO_LARGE error for a message of `bytes` (a request or a response, framing left
// out) over `maxMessageBytes`, refused before any of it was sent: it names the limit in MiB and
// points at blobs (troupe/actor/blob.h), which stream payloads of any size in chunks.
kj::Exception messageTooLarge(uint64_t bytes, uint64_t maxMessageBytes);

// What a message that could not be built because of `e` fails with: MESSAGE_TOO_LARGE (worded as
// messageTooLarge() is) when `e` is Cap'n Proto refusing a value too large for any message (a
// Data or Text of 512 MiB or more, a list of 2^29 elements or more: kj's "integer overflow" and
// the like), since every such message is over the limit too; null for any other error. Building
// a request happens before it is sent, so a call that fails this way never ran.
kj::Maybe<kj::Exception> tooLargeToBuild(const kj::Exception& e, uint64_t maxMessageBytes);

// What a server's connections may hold, together and each (ActorServerOptions::connections,
// RegistryServerOptions::connections). Whatever its peers send, careless or hostile, a server
// holds at most about maxConnections * 24 KiB plus maxIncompleteMessageBytes for connections
// and messages still arriving. Every connection closed for a bound is logged (warn) with the
// peer's address and the bound it passed.
struct ConnectionLimits {
  // Connections open at once, TLS handshakes included. One past it is closed as soon as it is
  // accepted. Default 4096.
  uint32_t maxConnections = 4096;

  // Bytes that messages still arriving may hold, across all connections. A message that does not
  // fit in its connection's 8 KiB read buffer reserves its whole size before its body is read;
  // one that would take the total past this waits, not reading (TCP holds its sender back),
  // until other messages complete. A message alone is always let in, so a message the size
  // limit allows never waits forever. Default 1 GiB.
  uint64_t maxIncompleteMessageBytes = uint64_t{1} << 30;

  // A connection that has not delivered one whole message this long after it was accepted (a
  // TLS handshake counts against it) is closed. Default 10 s.
  kj::Duration firstMessageTimeout = 10 * kj::SECONDS;

  // A message still incomplete this long after its first byte (or, for one that waited for the
  // budget above, after its turn came) is a stalled or trickling sender: its connection is
  // closed. Idle connections between messages are kept. Default 60 s, enough for a 512 MiB
  // message at 10 MB/s.
  kj::Duration messageTimeout = 60 * kj::SECONDS;
};

}  // namespace troupe
