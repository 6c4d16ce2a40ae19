#pragma once
// What a fuzz target does when a property it checks does not hold.

#include <stdio.h>
#include <stdlib.h>

#include <kj/exception.h>
#include <kj/string.h>

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

}  // namespace troupe::fuzz
