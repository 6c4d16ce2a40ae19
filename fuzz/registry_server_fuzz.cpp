// A RegistryServer in this process fed what a peer may send, as actor_server_fuzz.cpp feeds an
// ActorServer: each input over a fresh connection, read until the registry closes it, then the
// registry must still answer a real call (resolve) over a connection of its own. And since a
// registration lives only as long as the connection holding its lease, and a watch as long as
// the connection holding its watcher, neither may outlive the input's connection: once it is
// gone the registry holds no endpoints, no watchers and no connection but the checker's.
//
// The registry has a 1 MiB message limit and no cluster token. What inputs do to job states
// (createJob, setJobStatus) stays from one input to the next, as it would in a registry that
// serves many clients.

#include "troupe/net/channel.h"
#include "troupe/resolver/registry_server.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/raw_peer.h"

namespace troupe::fuzz {
namespace {

constexpr uint64_t MAX_MESSAGE_BYTES = 1 << 20;

// How many turns of the loop the registry may take to let go of a closed connection's leases
// and watchers after the connection's end reached the peer.
constexpr int RELEASE_TURNS = 1000;

// Never destroyed: see actor_server_fuzz.cpp.
struct Target {
  EventLoop loop{{.randomSeed = uint64_t{1}}};
  bool withoutCredentials = (setLoopCredentials(loop, noCredentials()), true);
  RegistryServer registry{loop, {.maxMessageBytes = MAX_MESSAGE_BYTES}};
  std::string address = registry.listen(privateSocketAddress());
  kj::Own<kj::NetworkAddress> raw = rawAddress(loop, address);
  kj::Own<Channel> checker = Channel::open(loop, address, {.maxMessageBytes = MAX_MESSAGE_BYTES});

  void checkServing() {
    auto request = checker->bootstrap<schema::Registry>().resolveRequest();
    request.setPrefix("");
    auto call = loop.timer().timeoutAfter(CLOSE_TIMEOUT, request.send());
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { call.wait(loop.waitScope()); })) {
      fprintf(stderr, "fuzz: %s\n", e->getDescription().cStr());
      check(false, "the registry stopped answering");
    }
  }

  bool released() {
    return registry.endpointCount() == 0 && registry.watcherCount() == 0 &&
           registry.connectionCount() <= 1;
  }

  void checkReleased() {
    for (int i = 0; i < RELEASE_TURNS && !released(); ++i) loop.waitScope().poll();
    check(registry.endpointCount() == 0, "a registration outlived its connection");
    check(registry.watcherCount() == 0, "a watch outlived its connection");
    check(registry.connectionCount() <= 1, "a closed connection is still counted");
  }
};

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::fuzz;
  NoStackTraces noStackTraces;
  static auto& target = *new Target;
  exchangeRaw(target.loop, *target.raw, kj::arrayPtr(data, size));
  target.checkReleased();
  target.checkServing();
  return 0;
}
