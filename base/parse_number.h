#pragma once
// parseWholeNumber: the one way troupe reads a count, an index, a port or a duration from text
// (environment variables, names, addresses, URLs, sizes).

#include <cstdint>

#include <kj/common.h>
#include <kj/string.h>

namespace troupe {

// Whether `c` is an ASCII digit, whatever the locale (unlike isdigit()).
constexpr bool isDigit(char c) { return '0' <= c && c <= '9'; }

// The value of `text` when it is a whole number written in decimal, at most `max`: one or more
// ASCII digits, with no sign, space, "0x" or other decoration (which kj::StringPtr::parseAs,
// following strtoull, would let through); null otherwise. Leading zeros are allowed.
kj::Maybe<uint64_t> parseWholeNumber(kj::ArrayPtr<const char> text, uint64_t max = UINT64_MAX);

}  // namespace troupe
