#pragma once
// Size limits on what crosses the wire.

#include <cstdint>

namespace troupe {

// The largest Cap'n Proto message (request or response, payload plus framing) a troupe
// connection accepts unless its options say otherwise: 512 MiB, so a 256 MiB tensor fits with
// room to spare. Both ends must agree: each side refuses to send a message over its own limit
// (only that call fails, with MESSAGE_TOO_LARGE), and a side that receives one over its limit
// closes that connection (its other connections keep serving). A receiver allocates at most
// this much for a message before reading it.
constexpr uint64_t DEFAULT_MAX_MESSAGE_BYTES = uint64_t{512} << 20;

}  // namespace troupe
