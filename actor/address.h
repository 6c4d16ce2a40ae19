#pragma once
// Address: where an ActorServer listens and where clients connect.

#include <cstdint>
#include <string>

#include <kj/string.h>

namespace troupe {

// A parsed "tcp://host:port" or "unix:/path". A plain value.
struct Address {
  enum class Kind : uint8_t { TCP, UNIX };

  Kind kind = Kind::TCP;
  std::string host;   // TCP: a name or an IP literal (IPv6 without brackets)
  uint16_t port = 0;  // TCP: 0 asks listen() to pick a free port
  std::string path;   // UNIX: the socket's file path

  // Accepts "tcp://HOST:PORT", "HOST:PORT" (TCP), "tcp://[V6]:PORT" and "unix:PATH" (also
  // "unix://PATH"). Throws INVALID_ARGUMENT saying what is wrong with anything else.
  static Address parse(kj::StringPtr text);

  // The canonical text: "tcp://host:port", "tcp://[v6]:port" or "unix:/path".
  std::string toString() const;

  // The same address in the form kj::Network::parseAddress() takes.
  kj::String toKjAddress() const;

  bool operator==(const Address&) const = default;
};

}  // namespace troupe
