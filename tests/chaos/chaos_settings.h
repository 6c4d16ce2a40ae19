#pragma once
// What one run of the chaos test does: its seed and how long the chaos lasts, from the
// environment, which chaos_main.cpp fills from the command line.
//
//   chaos_test [--seed N] [--minutes N] [GoogleTest flags]
//   TROUPE_CHAOS_SEED=N TROUPE_CHAOS_MINUTES=N ctest -R Chaos

#include <cstdint>

#include <kj/time.h>

namespace troupe::chaos {

struct ChaosSettings {
  // Seeds the chaos schedule, the load's mix of calls and the loop's jitter: TROUPE_CHAOS_SEED,
  // else one taken from the clock (printed, so that the run can be replayed).
  uint64_t seed = 0;

  // How long the load and the chaos run: TROUPE_CHAOS_MINUTES minutes, else DEFAULT_CHAOS_TIME,
  // which keeps the whole test near a minute.
  kj::Duration chaosTime = DEFAULT_CHAOS_TIME;

  static constexpr kj::Duration DEFAULT_CHAOS_TIME = 55 * kj::SECONDS;

  // Reads the variables; throws INVALID_ARGUMENT naming one that is not a whole number (minutes
  // must be at least 1).
  static ChaosSettings fromEnvironment();
};

// Moves "--seed N" and "--minutes N" (also "--seed=N", "--minutes=N") out of argv into
// TROUPE_CHAOS_SEED and TROUPE_CHAOS_MINUTES, leaving the rest for GoogleTest. The flags win
// over variables already set.
void takeFlags(int& argc, char** argv);

}  // namespace troupe::chaos
