#pragma once
// Random: the random numbers troupe's components draw for jitter (backoff, spreading retries),
// from their EventLoop, so that a test can make them repeat (EventLoopOptions::randomSeed).

#include <cstdint>
#include <random>

#include <kj/common.h>

namespace troupe {

// A seeded generator; the same seed gives the same numbers. Loop thread only (each EventLoop
// owns one: EventLoop::random()). Not for secrets.
class Random {
public:
  explicit Random(uint64_t seed) : engine(seed) {}
  KJ_DISALLOW_COPY(Random);

  // Uniformly distributed over [low, high); requires low < high.
  double uniform(double low, double high) {
    return std::uniform_real_distribution<double>(low, high)(engine);
  }

  // Uniformly distributed over [0, bound); requires bound > 0.
  uint64_t below(uint64_t bound) {
    return std::uniform_int_distribution<uint64_t>(0, bound - 1)(engine);
  }

private:
  std::mt19937_64 engine;
};

}  // namespace troupe
