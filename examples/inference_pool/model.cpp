#include "model.h"

#include <kj/debug.h>

namespace inference {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-scale, scale), from the top 24 bits (exactly representable as a float).
float uniform(uint64_t& state, float scale) {
  float unit = static_cast<float>(splitmix64(state) >> 40) / static_cast<float>(1 << 24);
  return (2 * unit - 1) * scale;
}

std::vector<float> draw(uint64_t& state, size_t count, float scale) {
  std::vector<float> values(count);
  for (auto& v : values) v = uniform(state, scale);
  return values;
}

}  // namespace

Model::Model(uint64_t seed) {
  uint64_t state = seed;
  // Scaled by 1/sqrt(fan-in) so that activations stay of order one.
  w1 = draw(state, MODEL_HIDDEN * MODEL_INPUTS, 0.125f);
  b1 = draw(state, MODEL_HIDDEN, 0.1f);
  w2 = draw(state, MODEL_OUTPUTS * MODEL_HIDDEN, 0.088f);
  b2 = draw(state, MODEL_OUTPUTS, 0.1f);
}

std::vector<float> Model::forward(const float* input, size_t size) const {
  KJ_REQUIRE(size == MODEL_INPUTS, "the model takes 64 inputs", size);
  std::vector<float> hidden(MODEL_HIDDEN);
  for (size_t h = 0; h < MODEL_HIDDEN; ++h) {
    float sum = b1[h];
    for (size_t i = 0; i < MODEL_INPUTS; ++i) sum += w1[h * MODEL_INPUTS + i] * input[i];
    hidden[h] = sum > 0 ? sum : 0;
  }
  std::vector<float> output(MODEL_OUTPUTS);
  for (size_t o = 0; o < MODEL_OUTPUTS; ++o) {
    float sum = b2[o];
    for (size_t h = 0; h < MODEL_HIDDEN; ++h) sum += w2[o * MODEL_HIDDEN + h] * hidden[h];
    output[o] = sum;
  }
  return output;
}

std::vector<float> sampleInput(uint64_t index) {
  uint64_t state = MODEL_SEED ^ (index * 0xd1b54a32d192ed03ull);
  return draw(state, MODEL_INPUTS, 1.0f);
}

}  // namespace inference
