#pragma once
// The model the parameter-server example trains: logistic regression on a generated data set.
// Every process generates the same data from the same seed, so the driver, the shards and the
// trainers agree on it without shipping it around.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ps {

// The seed every process generates the data set from.
constexpr uint64_t DATA_SEED = 20261130;

// How many examples the data set has.
constexpr size_t DATA_EXAMPLES = 4096;

// A plain value: `count` examples of `dim` features each, row-major, labelled 0 or 1 by the sign
// of trueWeights . x (no noise, so the loss can approach 0).
struct Dataset {
  size_t dim = 0;
  size_t count = 0;
  std::vector<float> features;     // count * dim, each uniform in [-1, 1)
  std::vector<float> labels;       // count
  std::vector<float> trueWeights;  // dim, each uniform in [-1, 1)

  const float* example(size_t i) const { return features.data() + i * dim; }
};

// The data set for a model of dimension `dim`: deterministic in (dim, count, seed).
Dataset makeDataset(size_t dim, size_t count = DATA_EXAMPLES, uint64_t seed = DATA_SEED);

// The first weight of shard `index` of `shards` over a model of dimension `dim`; shard i owns
// [shardBegin(i), shardBegin(i + 1)).
uint32_t shardBegin(uint32_t dim, uint32_t index, uint32_t shards);

// The mean log-loss of `weights` over the examples `first`, `first + stride`, ... below
// data.count (all of them by default).
double logLoss(const Dataset& data, const std::vector<float>& weights, size_t first = 0,
               size_t stride = 1);

// The gradient of the mean log-loss over the examples `batch` (indices below data.count), into
// `gradient` (resized to data.dim). Returns that minibatch's loss.
double gradient(const Dataset& data, const std::vector<float>& weights,
                const std::vector<size_t>& batch, std::vector<float>& gradient);

// The cosine of the angle between `a` and `b` (0 when either is zero): how well the learned
// weights point along the true ones.
double cosine(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace ps
