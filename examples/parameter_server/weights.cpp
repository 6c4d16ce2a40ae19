#include "weights.h"

#include <kj/debug.h>

namespace ps {

kj::Promise<Snapshot> pullWeights(troupe::ActorPool<ParameterServer>& pool, uint32_t dim,
                                  kj::Duration deadline) {
  return pool.broadcast([](ParameterServer::Client shard) { return shard.pullRequest().send(); })
      .waitAll(deadline)
      .then([dim](auto results) {
        Snapshot snapshot;
        snapshot.weights.assign(dim, 0.0f);
        std::vector<bool> covered(dim, false);
        for (auto& r : results) {
          KJ_IF_MAYBE(e, r.error) {
            KJ_FAIL_REQUIRE("pull failed", r.endpoint.name, e->getDescription());
          }
          auto& reply = KJ_ASSERT_NONNULL(r.value);
          uint32_t begin = reply.getBegin(), end = reply.getEnd();
          auto slice = reply.getWeights();
          KJ_REQUIRE(reply.getDim() == dim && begin < end && end <= dim &&
                         slice.size() == end - begin,
                     "shard of another model", r.endpoint.name, dim, reply.getDim(), begin, end);
          for (uint32_t i = begin; i < end; ++i) {
            KJ_REQUIRE(!covered[i], "shards overlap", r.endpoint.name, i);
            covered[i] = true;
            snapshot.weights[i] = slice[i - begin];
          }
          snapshot.shards.push_back(
              {r.endpoint.name, r.endpoint.address, begin, end, reply.getVersion()});
        }
        for (uint32_t i = 0; i < dim; ++i) {
          KJ_REQUIRE(covered[i], "no ready shard owns this weight", i, results.size());
        }
        return snapshot;
      });
}

}  // namespace ps
