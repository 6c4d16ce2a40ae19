#pragma once
// RegistryDaemon: the chaos test's troupe-registry, a child process that the test restarts on
// the same unix socket, so that every client finds it again by itself.

#include <memory>
#include <string>

#include <kj/async.h>

#include "troupe/base/event_loop.h"
#include "tests/support/registry_helpers.h"

namespace troupe::chaos {

// Owns the daemon's process (test::RegistryProcess) between restarts; destroying it kills and
// reaps the process, also while a restart is under way (the restart's thread then does it).
// Loop thread only. A unix socket of the test's own, not a TCP port: a restart finds its path
// free, where a port could meanwhile be taken (the replicas keep connecting while it is down).
class RegistryDaemon {
public:
  // Starts the daemon (blocking until it listens). Throws when it could not listen.
  explicit RegistryDaemon(EventLoop& loop);
  ~RegistryDaemon() noexcept(false);
  KJ_DISALLOW_COPY(RegistryDaemon);

  // The lease the daemon gives registrations that ask for none, in milliseconds (troupe
  // registry --default-ttl): a replica frozen longer leaves the registry until it is thawed.
  static constexpr uint32_t LEASE_MS = 3000;

  // "registry+unix:<path>", for TROUPE_RESOLVER and openResolver().
  std::string url() const;

  // True while restart() is under way.
  bool restarting() const { return process.get() == nullptr; }

  // Stops the daemon with `signal` (SIGTERM or SIGKILL), waits for it to exit and starts it
  // again on the same address, on a thread of the loop's pool so that the loop runs on
  // meanwhile. Resolves with the stopped daemon's wait status; rejects when it did not exit
  // within test::PATIENCE or the new one did not listen (there is no daemon after that).
  // Requires !restarting().
  kj::Promise<int> restart(int signal);

  // Stops the daemon with SIGTERM and returns its wait status (blocking, up to PATIENCE; -1 if
  // it did not exit by then, and it is killed). Requires !restarting().
  int stop();

private:
  EventLoop& loop;
  test::TempSocket socket;
  std::string listen;  // "unix:<path>"
  kj::Own<test::RegistryProcess> process;
};

}  // namespace troupe::chaos
