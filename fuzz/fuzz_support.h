#pragma once
// What the fuzz targets share: how a property that does not hold is reported, exceptions without
// stack traces, and credentials that do not depend on the environment.

#include <stdio.h>
#include <stdlib.h>

#include <memory>

#include <kj/exception.h>
#include <kj/string.h>

#include "troupe/net/credentials.h"

namespace troupe::fuzz {

// Says which property failed and aborts: libFuzzer reports the abort as a crash and saves the
// input. (An exception would be taken for the expected failure of a bad input, or end in
// std::terminate with less said.)
inline void check(bool holds, kj::StringPtr property) {
  if (holds) return;
  fprintf(stderr, "fuzz: property failed: %s\n", property.cStr());
  abort();
}

// While it is on the stack, kj exceptions carry no stack trace. Most inputs are refused with an
// exception, often several, and unwinding the stack to record a trace for each costs more than
// the rest of the input; nothing here prints them. One per LLVMFuzzerTestOneInput call.
class NoStackTraces final : public kj::ExceptionCallback {
public:
  StackTraceMode stackTraceMode() override { return StackTraceMode::NONE; }
};

// No TLS, no cluster token: stated rather than read from the environment, where TROUPE_TOKEN
// would change what inputs can reach.
inline std::shared_ptr<Credentials> noCredentials() {
  return std::make_shared<Credentials>(CredentialsOptions{});
}

}  // namespace troupe::fuzz
