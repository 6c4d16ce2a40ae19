// A registrant for multi-process registry tests: registers one endpoint through a
// RegistryResolver and keeps it registered until SIGTERM/SIGINT (exit 0), printing
//
//   REGISTERED <name>            once the registry first accepts it
//   REFUSED <code> <message>     when the registry refuses it for good (then exits 3)
//
//   troupe_test_registrant REGISTRY NAME [--address ADDR] [--incarnation N] [--ttl-ms N]
//                                        [--renew-ms N] [--state starting|ready|draining]
//                                        [--metadata KEY=VALUE]...
//
// REGISTRY is a RegistryResolver address (registry://HOST:PORT, registry+unix:PATH, ...), or an
// etcd resolver URL (etcd://..., etcd+unix:...; --ttl-ms then sets its lease TTL, and
// --renew-ms does not apply). Each --metadata puts KEY (up to the first '=') and VALUE into the
// endpoint's metadata. It logs to stderr. Freezing it (SIGSTOP) stops its renewals; the
// resolver then expires its lease.

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>

#include <kj/debug.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/resolver/etcd_resolver.h"
#include "troupe/resolver/registry_resolver.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr,
            "usage: %s REGISTRY NAME [--address A] [--incarnation N] [--ttl-ms N] "
            "[--state S] [--metadata KEY=VALUE]...\n",
            argv[0]);
    return 2;
  }
  troupe::Endpoint endpoint;
  endpoint.name = argv[2];
  endpoint.address = "tcp://127.0.0.1:1";
  endpoint.incarnation = 1;
  endpoint.state = troupe::EndpointState::READY;
  troupe::RegistryResolverOptions options;
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--address") {
      endpoint.address = value;
    } else if (flag == "--incarnation") {
      endpoint.incarnation = strtoull(value, nullptr, 10);
    } else if (flag == "--ttl-ms") {
      options.ttl = static_cast<int64_t>(strtoull(value, nullptr, 10)) * kj::MILLISECONDS;
    } else if (flag == "--renew-ms") {
      options.renewInterval = static_cast<int64_t>(strtoull(value, nullptr, 10)) * kj::MILLISECONDS;
    } else if (flag == "--state") {
      std::string s = value;
      endpoint.state = s == "starting"   ? troupe::EndpointState::STARTING
                       : s == "draining" ? troupe::EndpointState::DRAINING
                                         : troupe::EndpointState::READY;
    } else if (flag == "--metadata") {
      std::string pair = value;
      auto eq = pair.find('=');
      if (eq == std::string::npos || eq == 0) {
        fprintf(stderr, "--metadata wants KEY=VALUE, got %s\n", value);
        return 2;
      }
      endpoint.metadata[pair.substr(0, eq)] = pair.substr(eq + 1);
    } else {
      fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }

  auto logger = spdlog::stderr_color_mt("registrant");
  options.logger = logger;
  troupe::EventLoop loop(troupe::EventLoopOptions{.logger = logger});
  kj::StringPtr url = argv[1];
  kj::Own<troupe::Resolver> resolver;
  if (url.startsWith("etcd")) {
    auto etcd = troupe::EtcdResolver::parseUrl(url);
    if (options.ttl > 0 * kj::SECONDS) etcd.ttl = options.ttl;
    etcd.logger = logger;
    resolver = kj::heap<troupe::EtcdResolver>(loop, kj::mv(etcd));
  } else {
    resolver = kj::heap<troupe::RegistryResolver>(loop, url, options);
  }
  auto registration = resolver->registerEndpoint(endpoint);

  auto done = registration->whenRegistered().then(
      [&]() -> kj::Promise<int> {
        printf("REGISTERED %s\n", endpoint.name.c_str());
        fflush(stdout);
        return loop.onSignal({SIGTERM, SIGINT}).then([](int) { return 0; });
      },
      [&](kj::Exception&& e) -> kj::Promise<int> {
        printf("REFUSED %s %s\n", troupe::errorCodeName(troupe::errorCode(e)).cStr(),
               e.getDescription().cStr());
        fflush(stdout);
        return 3;
      });
  int status = done.wait(loop.waitScope());
  registration = nullptr;
  return status;
}
