#pragma once
// Opening listening sockets synchronously, with clear errors.

#include <string>

#include <kj/async-io.h>

#include "troupe/net/address.h"

namespace troupe {

struct ListenSocket {
  kj::Own<kj::ConnectionReceiver> receiver;
  Address bound;          // with the port the kernel picked
  bool ownsPath = false;  // a unix socket file we created and must remove
};

// Binds and listens on `address` (resolving a TCP host name synchronously; listen addresses are
// local). Throws INVALID_ARGUMENT for an unusable address and ADDRESS_IN_USE when it is taken. A
// unix socket file with nothing listening behind it is replaced.
ListenSocket openListenSocket(kj::LowLevelAsyncIoProvider& io, const Address& address);

// Removes a unix socket file created by openListenSocket.
void removeSocketFile(const Address& address);

}  // namespace troupe
