#pragma once
// What the resolvers' URL parsers share: splitting a list, and the "ttl_ms=N" option.

#include <kj/string.h>
#include <kj/time.h>
#include <kj/vector.h>

#include "troupe/base/parse_number.h"

namespace troupe::resolver_detail {

// The parts of `text` between `separator`s, in order, empty ones included ("" gives one).
inline kj::Vector<kj::String> splitParts(kj::StringPtr text, char separator) {
  kj::Vector<kj::String> parts;
  for (;;) {
    KJ_IF_MAYBE(at, text.findFirst(separator)) {
      parts.add(kj::heapString(text.slice(0, *at)));
      text = text.slice(*at + 1);
    } else {
      parts.add(kj::heapString(text));
      return parts;
    }
  }
}

// The lease TTL that "ttl_ms=<digits>" asks for. Calls `bad` (which throws) with the reason
// for digits that are not 1 to 999999999.
template <typename Bad>
kj::Duration parseTtlMillis(kj::StringPtr digits, Bad&& bad) {
  KJ_IF_MAYBE(ms, parseWholeNumber(digits, 999999999)) {
    if (*ms == 0) bad("ttl_ms must be positive");
    return *ms * kj::MILLISECONDS;
  }
  bad("ttl_ms takes a number of milliseconds, 1 to 999999999");
  KJ_UNREACHABLE;
}

}  // namespace troupe::resolver_detail
