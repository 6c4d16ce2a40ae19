#pragma once
// The model every replica serves: a fixed two-layer perceptron (MODEL_INPUTS -> MODEL_HIDDEN,
// ReLU, -> MODEL_OUTPUTS) whose weights come from a fixed seed, so that every replica, and the
// driver checking their answers, hold the same model and compute the same outputs bit for bit.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace inference {

constexpr size_t MODEL_INPUTS = 64;
constexpr size_t MODEL_HIDDEN = 128;
constexpr size_t MODEL_OUTPUTS = 10;
constexpr uint64_t MODEL_SEED = 20240601;

// A plain value, immutable once built; safe to share between threads.
class Model {
public:
  // Draws every weight and bias from `seed` (splitmix64, so the same on every platform).
  explicit Model(uint64_t seed = MODEL_SEED);

  // The outputs for `input`, which must hold MODEL_INPUTS values (KJ_REQUIRE: a caller's
  // mistake, reported to it as FAILED).
  std::vector<float> forward(const float* input, size_t size) const;

private:
  std::vector<float> w1, b1;  // MODEL_HIDDEN x MODEL_INPUTS, row-major; MODEL_HIDDEN
  std::vector<float> w2, b2;  // MODEL_OUTPUTS x MODEL_HIDDEN, row-major; MODEL_OUTPUTS
};

// The input of request number `index`: MODEL_INPUTS values in [-1, 1), a function of `index`
// alone, so that the driver can recompute what it sent.
std::vector<float> sampleInput(uint64_t index);

}  // namespace inference
