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

// What a side that received a message of `bytes` over its `maxMessageBytes` closes the connection
// with (MESSAGE_TOO_LARGE); its peer reads it as the reason the connection ended.
kj::Exception incomingTooLarge(uint64_t bytes, uint64_t maxMessageBytes);

// The limit a peer named when it closed the connection for a message over it (incomingTooLarge(),
// as the connection's end reached this side); null when `e` is anything else. A message of ours
// larger than that limit can never reach that peer, so a call carrying one never ran there.
kj::Maybe<uint64_t> peerMessageLimit(const kj::Exception& e);

// What a server's connections may hold, together and each (ActorServerOptions::connections,
// RegistryServerOptions::connections). Whatever its peers send, careless or hostile, a server
// holds at most about maxConnections * 24 KiB plus maxIncompleteMessageBytes for connections
// and messages still arriving. Every connection closed for a bound is logged (warn) with the
// peer's address and the bound it passed, and counted (troupe_connections_refused_total,
// troupe_connections_timed_out_total{timeout="first_message"|"message"}).
struct ConnectionLimits {
  // Connections open at once, TLS handshakes included. One past it is closed as soon as it is
  // accepted. Default 4096.
  uint32_t maxConnections = 4096;

  // Bytes that messages still arriving may hold, across all connections, shared so that no
  // connection, nor any group of connections from one address, can keep the others' messages
  // waiting. A message that does not fit in its connection's 8 KiB read buffer takes nothing
  // until its body begins to arrive (a peer that announces a message and sends nothing holds
  // nothing), then:
  // * it is let in whole when nothing else is held (a message alone always is, so one the size
  //   limit allows never waits forever), or when it fits in what is free and the messages let in
  //   whole hold at most half of this with it;
  // * otherwise it is read in steps of 1 MiB, each granted before it is read, so that it holds
  //   what has arrived plus one step. A step goes only to a message that could be completed from
  //   what is free (messages arriving together never wait for each other), and waiting messages
  //   are served in turn, first those holding less than their fair share: this divided by the
  //   messages arriving, and for their peer address this divided by the addresses sending them.
  //   The others get what those cannot use.
  // A message that waits is not read (TCP holds its sender back), and its wait counts against
  // the timeouts below. Keep it at least twice the message size limit, so that a message the
  // limit allows can be let in whole beside others. Default 1 GiB.
  uint64_t maxIncompleteMessageBytes = uint64_t{1} << 30;

  // A connection that has not delivered one whole message this long after it was accepted (a
  // TLS handshake counts against it, and so does waiting for the budget above) is closed.
  // Default 10 s.
  kj::Duration firstMessageTimeout = 10 * kj::SECONDS;

  // A message still incomplete this long after its first byte, however long of that it waited
  // for the budget above, is a stalled or trickling sender: its connection is closed (sooner
  // for a connection's first message if firstMessageTimeout ends first). Idle connections
  // between messages are kept. Default 60 s, enough for a 512 MiB message at 10 MB/s.
  kj::Duration messageTimeout = 60 * kj::SECONDS;
};

}  // namespace troupe
