#include "tests/chaos/registry_daemon.h"

#include <signal.h>

#include <stdexcept>

#include <kj/debug.h>

namespace troupe::chaos {

namespace {

// The daemon's flags: quiet unless something is wrong, since it restarts many times, and a
// lease of LEASE_MS for registrations that ask for none (the replicas'), so that a freeze longer
// than that drops the frozen member and its thaw brings it back.
std::vector<std::string> daemonFlags() {
  return {"--log-level", "warn", "--default-ttl", std::to_string(RegistryDaemon::LEASE_MS) + "ms"};
}

// The daemon listening on `listen`. A daemon that was killed leaves its socket file; the next
// one, started once the old one has exited, finds nothing answering there and takes it over.
kj::Own<test::RegistryProcess> startOn(const std::string& listen) {
  return kj::heap<test::RegistryProcess>(listen, daemonFlags());
}

}  // namespace

RegistryDaemon::RegistryDaemon(EventLoop& loop)
    : loop(loop), socket("chaos"), listen("unix:" + socket.path), process(startOn(listen)) {}

RegistryDaemon::~RegistryDaemon() noexcept(false) {}

std::string RegistryDaemon::url() const { return "registry+" + listen; }

kj::Promise<int> RegistryDaemon::restart(int signal) {
  KJ_REQUIRE(!restarting(), "the registry is restarting already");
  struct Restarted {
    int status;
    kj::Own<test::RegistryProcess> process;
  };
  auto restarted = loop.offload([old = kj::mv(process), listen = listen, signal]() mutable {
    old->process.kill(signal);
    int status = old->process.wait(test::PATIENCE / kj::MILLISECONDS);
    if (status == -1) throw std::runtime_error("troupe-registry did not exit after its signal");
    old = nullptr;
    return Restarted{status, startOn(listen)};
  });
  return restarted.then([this](Restarted&& r) {
    process = kj::mv(r.process);
    return r.status;
  });
}

int RegistryDaemon::stop() {
  KJ_REQUIRE(!restarting(), "the registry is restarting");
  process->process.kill(SIGTERM);
  int status = process->process.wait(test::PATIENCE / kj::MILLISECONDS);
  process = nullptr;
  return status;
}

}  // namespace troupe::chaos
