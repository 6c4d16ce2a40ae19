#pragma once
// A peer that speaks no protocol, for fuzz targets that feed a server in their own process raw
// bytes over a real connection.

#include <string>

#include <kj/array.h>
#include <kj/async-io.h>
#include <kj/time.h>

#include "troupe/base/event_loop.h"

namespace troupe::fuzz {

// How long a server may take to close a connection whose peer has sent everything and shut its
// side down: far more than loopback needs, and less than libFuzzer's own timeout (fuzz.sh), so
// that a server that keeps such a connection open is reported as such rather than as a slow
// input.
constexpr kj::Duration CLOSE_TIMEOUT = 10 * kj::SECONDS;

// Connects to `server` (listening on `loop`), writes `bytes`, shuts the connection down for
// writing, and reads until the server closes it; returns what the server wrote. Write and read
// errors (a server that hangs up on garbage may reset the connection) end the exchange early.
// Aborts when the server has not closed the connection within CLOSE_TIMEOUT.
kj::Array<kj::byte> exchangeRaw(EventLoop& loop, kj::NetworkAddress& server,
                                kj::ArrayPtr<const kj::byte> bytes);

// A unix socket address in a new private folder ("unix:/tmp/troupe-fuzz-XXXXXX/server"), for a
// server to listen on. Unix sockets rather than TCP on loopback: a fuzzer makes thousands of
// connections a second, each of which would hold a TCP port in TIME_WAIT for a minute. The
// folder and the socket are removed when the process exits.
std::string privateSocketAddress();

// The address a server's listen() returned, for exchangeRaw().
kj::Own<kj::NetworkAddress> rawAddress(EventLoop& loop, kj::StringPtr address);

}  // namespace troupe::fuzz
