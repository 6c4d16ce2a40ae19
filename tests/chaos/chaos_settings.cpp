#include "tests/chaos/chaos_settings.h"

#include <stdlib.h>
#include <string.h>

#include <string>

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"

namespace troupe::chaos {

namespace {

constexpr const char* SEED_VARIABLE = "TROUPE_CHAOS_SEED";
constexpr const char* MINUTES_VARIABLE = "TROUPE_CHAOS_MINUTES";

// The value of `name`, a whole number of at least `min`; null when unset.
kj::Maybe<uint64_t> wholeVariable(const char* name, uint64_t min) {
  const char* text = getenv(name);
  if (text == nullptr) return nullptr;
  KJ_IF_MAYBE(value, parseWholeNumber(kj::StringPtr(text))) {
    if (*value >= min) return *value;
  }
  throwError(ErrorCode::INVALID_ARGUMENT, kj::str(name, " must be a whole number of at least ", min,
                                                  ", not '", printable(std::string(text)), "'"));
}

uint64_t seedFromClock() {
  return static_cast<uint64_t>((kj::systemPreciseCalendarClock().now() - kj::UNIX_EPOCH) /
                               kj::NANOSECONDS);
}

}  // namespace

ChaosSettings ChaosSettings::fromEnvironment() {
  ChaosSettings settings;
  settings.seed = wholeVariable(SEED_VARIABLE, 0).orDefault(seedFromClock());
  KJ_IF_MAYBE(minutes, wholeVariable(MINUTES_VARIABLE, 1)) {
    settings.chaosTime = static_cast<int64_t>(*minutes) * kj::MINUTES;
  }
  return settings;
}

void takeFlags(int& argc, char** argv) {
  struct Flag {
    const char* name;
    const char* variable;
  };
  const Flag flags[] = {{"--seed", SEED_VARIABLE}, {"--minutes", MINUTES_VARIABLE}};
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    bool taken = false;
    for (auto& flag : flags) {
      std::string name = flag.name;
      if (arg == name && i + 1 < argc) {
        setenv(flag.variable, argv[++i], 1);
        taken = true;
      } else if (arg.rfind(name + "=", 0) == 0) {
        setenv(flag.variable, arg.c_str() + name.size() + 1, 1);
        taken = true;
      }
    }
    if (!taken) argv[kept++] = argv[i];
  }
  argc = kept;
  argv[argc] = nullptr;
}

}  // namespace troupe::chaos
