#include "model.h"

#include <cmath>

#include <kj/debug.h>

namespace ps {

namespace {

// SplitMix64: a tiny generator whose output is the same in every process and on every
// platform (std::uniform_real_distribution's is not specified).
class Random {
public:
  explicit Random(uint64_t seed) : state(seed) {}

  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform in [-1, 1).
  float symmetric() { return static_cast<float>((next() >> 40) * 0x1.0p-24 * 2.0 - 1.0); }

private:
  uint64_t state;
};

double dot(const float* a, const float* b, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += double(a[i]) * b[i];
  return sum;
}

// log(1 + e^-z) for label 1 and log(1 + e^z) for label 0, without overflow.
double exampleLoss(double z, float label) {
  double m = label > 0.5f ? -z : z;
  return m > 0 ? m + std::log1p(std::exp(-m)) : std::log1p(std::exp(m));
}

}  // namespace

Dataset makeDataset(size_t dim, size_t count, uint64_t seed) {
  KJ_REQUIRE(dim > 0 && count > 0, "empty data set", dim, count);
  Dataset data;
  data.dim = dim;
  data.count = count;
  Random random(seed);
  data.trueWeights.resize(dim);
  for (auto& w : data.trueWeights) w = random.symmetric();
  data.features.resize(dim * count);
  for (auto& x : data.features) x = random.symmetric();
  data.labels.resize(count);
  for (size_t i = 0; i < count; ++i) {
    data.labels[i] = dot(data.example(i), data.trueWeights.data(), dim) > 0 ? 1.0f : 0.0f;
  }
  return data;
}

uint32_t shardBegin(uint32_t dim, uint32_t index, uint32_t shards) {
  return static_cast<uint32_t>(uint64_t{dim} * index / shards);
}

double logLoss(const Dataset& data, const std::vector<float>& weights, size_t first,
               size_t stride) {
  KJ_REQUIRE(weights.size() == data.dim, weights.size(), data.dim);
  KJ_REQUIRE(stride > 0);
  double sum = 0;
  size_t n = 0;
  for (size_t i = first; i < data.count; i += stride, ++n) {
    sum += exampleLoss(dot(data.example(i), weights.data(), data.dim), data.labels[i]);
  }
  return n == 0 ? 0 : sum / n;
}

double gradient(const Dataset& data, const std::vector<float>& weights,
                const std::vector<size_t>& batch, std::vector<float>& gradient) {
  KJ_REQUIRE(weights.size() == data.dim, weights.size(), data.dim);
  KJ_REQUIRE(!batch.empty());
  std::vector<double> sum(data.dim, 0.0);
  double loss = 0;
  for (size_t i : batch) {
    KJ_REQUIRE(i < data.count, i, data.count);
    const float* x = data.example(i);
    double z = dot(x, weights.data(), data.dim);
    loss += exampleLoss(z, data.labels[i]);
    // d/dz of the log-loss is sigmoid(z) - label.
    double residual = 1.0 / (1.0 + std::exp(-z)) - data.labels[i];
    for (size_t j = 0; j < data.dim; ++j) sum[j] += residual * x[j];
  }
  size_t n = batch.size();
  gradient.resize(data.dim);
  for (size_t j = 0; j < data.dim; ++j) gradient[j] = static_cast<float>(sum[j] / n);
  return loss / n;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  KJ_REQUIRE(a.size() == b.size());
  double ab = dot(a.data(), b.data(), a.size());
  double aa = dot(a.data(), a.data(), a.size());
  double bb = dot(b.data(), b.data(), b.size());
  return aa == 0 || bb == 0 ? 0 : ab / std::sqrt(aa * bb);
}

}  // namespace ps
