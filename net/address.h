#pragma once
// Address: where an ActorServer listens and where clients connect.

#include <cstdint>
#include <string>

#include <kj/string.h>

namespace troupe {

// A parsed "tcp://host:port", "tls://host:port" or "unix:/path". A plain value.
struct Address {
  // TLS is TCP with TLS over it (Credentials): a server listening on tls:// presents a
  // certificate, and clients verify it.
  enum class Kind : uint8_t { TCP, UNIX, TLS };

  Kind kind = Kind::TCP;
  std::string host;   // TCP, TLS: a name or an IP literal (IPv6 without brackets)
  uint16_t port = 0;  // TCP, TLS: 0 asks listen() to pick a free port
  std::string path;   // UNIX: the socket's file path

  // Accepts "tcp://HOST:PORT", "HOST:PORT" (TCP), "tcp://[V6]:PORT", the same with "tls://",
  // and "unix:PATH" (also "unix://PATH"). Throws INVALID_ARGUMENT saying what is wrong with
  // anything else.
  static Address parse(kj::StringPtr text);

  // The canonical text: "tcp://host:port", "tcp://[v6]:port" (tls:// alike) or "unix:/path".
  std::string toString() const;

  // TCP or TLS: a host and a port.
  bool isInet() const { return kind != Kind::UNIX; }

  // The same address in the form kj::Network::parseAddress() takes.
  kj::String toKjAddress() const;

  bool operator==(const Address&) const = default;
};

}  // namespace troupe
