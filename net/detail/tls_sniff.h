#pragma once
// What a tls:// listener does with the first byte of a connection: a TLS client's handshake
// starts with 0x16 and goes on to kj-tls; anything else is answered, as a plain Cap'n Proto
// client would understand it, with an Abort naming the tls:// address, and closed. Without
// this, a plain client sees only its connection close.

#include <kj/async-io.h>

namespace troupe::net_detail {

// Reads the first byte of `stream`. Resolves with a stream that yields every byte, that one
// included, when it starts a TLS record; otherwise writes a Cap'n Proto Abort saying "this
// server speaks TLS: connect to `tlsAddress`", shuts the stream down and resolves with null.
// Resolves with null at once for a stream that ends before its first byte.
kj::Promise<kj::Maybe<kj::Own<kj::AsyncIoStream>>> sniffTls(kj::Own<kj::AsyncIoStream> stream,
                                                            kj::StringPtr tlsAddress);

}  // namespace troupe::net_detail
