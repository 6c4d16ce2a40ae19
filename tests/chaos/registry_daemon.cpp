#include "tests/chaos/registry_daemon.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>

#include <kj/debug.h>

namespace troupe::chaos {

namespace {

// How many times a start (or restart) tries before it gives up.
constexpr int START_TRIES = 20;

// The lowest port the kernel hands out for port 0 and outgoing connections.
uint32_t ephemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  uint32_t low = 0;
  uint32_t high = 0;
  if (!(in >> low >> high) || low <= 2048) return 32768;  // Linux's default
  return low;
}

// The daemon's flags: quiet unless something is wrong, since it restarts many times, and a
// lease of LEASE_MS for registrations that ask for none (the replicas'), so that a freeze longer
// than that drops the frozen member and its thaw brings it back.
std::vector<std::string> daemonFlags() {
  return {"--log-level", "warn", "--default-ttl-ms", std::to_string(RegistryDaemon::LEASE_MS)};
}

// The daemon listening on `listen`, trying up to START_TRIES times: the port may be in use for
// a moment after the daemon that held it died, until the kernel lets go of the sockets that
// still name it.
kj::Own<test::RegistryProcess> startOn(const std::string& listen) {
  for (int i = 1;; ++i) {
    try {
      return kj::heap<test::RegistryProcess>(listen, daemonFlags());
    } catch (const std::exception&) {
      if (i == START_TRIES) throw;
      usleep(100 * 1000);  // a thread of the loop's pool, not the loop: the loop runs on
    }
  }
}

}  // namespace

RegistryDaemon::RegistryDaemon(EventLoop& loop, Random& random) : loop(loop) {
  uint32_t low = ephemeralLow();
  uint32_t base = low > 12000 ? 10000 : 1024;
  for (int i = 1; process.get() == nullptr; ++i) {
    auto port = base + random.below(low - base);
    listen = "tcp://127.0.0.1:" + std::to_string(port);
    try {
      process = kj::heap<test::RegistryProcess>(listen, daemonFlags());
    } catch (const std::exception&) {
      if (i == START_TRIES) throw;  // every port tried was taken: something else is wrong
    }
  }
}

RegistryDaemon::~RegistryDaemon() noexcept(false) {}

std::string RegistryDaemon::url() const {
  return "registry://" + listen.substr(strlen("tcp://"));
}

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
