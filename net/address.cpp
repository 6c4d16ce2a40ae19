#include "troupe/net/address.h"

#include <sys/un.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"

namespace troupe {

namespace {

[[noreturn]] void bad(kj::StringPtr text, kj::StringPtr why) {
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str("bad address '", text, "': ", why,
                     " (expected tcp://HOST:PORT, tls://HOST:PORT or unix:/PATH)"));
}

}  // namespace

Address Address::parse(kj::StringPtr text) {
  Address a;
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      bad("...", "contains control characters");
  }
  if (text.startsWith("unix:")) {
    a.kind = Kind::UNIX;
    kj::StringPtr path = text.slice(5);
    if (path.startsWith("//")) path = path.slice(2);
    if (path.size() == 0) bad(text, "empty socket path");
    if (path.size() >= sizeof(sockaddr_un::sun_path)) {
      bad(text, kj::str("socket path is ", path.size(), " bytes; the limit is ",
                        sizeof(sockaddr_un::sun_path) - 1));
    }
    a.path = path.cStr();
    return a;
  }
  kj::StringPtr rest = text;
  if (rest.startsWith("tcp://")) {
    rest = rest.slice(6);
  } else if (rest.startsWith("tls://")) {
    a.kind = Kind::TLS;
    rest = rest.slice(6);
  } else {
    for (size_t i = 0; i + 3 <= rest.size(); ++i) {
      if (rest.slice(i).startsWith("://")) bad(text, "unknown scheme");
    }
  }
  kj::StringPtr portText;
  if (rest.startsWith("[")) {
    KJ_IF_MAYBE(close, rest.findFirst(']')) {
      a.host = std::string(rest.begin() + 1, *close - 1);
      kj::StringPtr after = rest.slice(*close + 1);
      if (!after.startsWith(":")) bad(text, "no port after ']'");
      portText = after.slice(1);
    } else {
      bad(text, "unclosed '['");
    }
  } else {
    KJ_IF_MAYBE(colon, rest.findLast(':')) {
      a.host = std::string(rest.begin(), *colon);
      portText = rest.slice(*colon + 1);
      if (a.host.find(':') != std::string::npos) bad(text, "IPv6 hosts go in brackets");
    } else {
      bad(text, "no port");
    }
  }
  if (a.host.empty()) bad(text, "empty host");
  for (char c : a.host) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_' || c == ':' || c == '%' || c == '*';
    if (!ok) bad(text, "the host may hold only letters, digits and . - _ : % *");
  }
  if (portText.size() == 0) bad(text, "bad port");
  KJ_IF_MAYBE(port, parseWholeNumber(portText)) {
    if (*port > 65535) bad(text, "port above 65535");
    a.port = static_cast<uint16_t>(*port);
  } else {
    bad(text, "port is not a number");
  }
  return a;
}

std::string Address::toString() const {
  // "unix://" is read as a prefix, so a path that itself starts with "//" keeps it explicit.
  if (kind == Kind::UNIX) return (path.rfind("//", 0) == 0 ? "unix://" : "unix:") + path;
  std::string scheme = kind == Kind::TLS ? "tls://" : "tcp://";
  if (host.find(':') != std::string::npos) {
    return scheme + "[" + host + "]:" + std::to_string(port);
  }
  return scheme + host + ":" + std::to_string(port);
}

kj::String Address::toKjAddress() const {
  if (kind == Kind::UNIX) return kj::str("unix:", path);
  if (host.find(':') != std::string::npos) return kj::str('[', host, "]:", port);
  return kj::str(host, ':', port);
}

}  // namespace troupe
