// `troupe registry` (and the troupe-registry daemon): runs a RegistryServer in the foreground.
//
//   troupe registry [--listen ADDRESS] [--default-ttl-ms N] [--max-endpoint-bytes N]
//
// ADDRESS is "tcp://HOST:PORT" (default tcp://0.0.0.0:7700; port 0 picks a free one) or
// "unix:PATH"; --listen may be given more than once. Prints "LISTENING <address>" on stdout for
// each address once it listens (scripts and tests wait for it), logs to stderr, and stops
// cleanly on SIGTERM or SIGINT (exit status 0). Exits 1 when it cannot listen, 2 on bad usage.

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include <kj/debug.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/errors.h"
#include "troupe/actor/event_loop.h"
#include "troupe/resolver/registry_server.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

constexpr const char* USAGE =
    "usage: %s [--listen ADDRESS]... [--default-ttl-ms N] [--max-endpoint-bytes N]\n"
    "       [--log-level trace|debug|info|warn|error|off]\n"
    "Runs the registry (troupe's default resolver) in the foreground until SIGTERM or SIGINT.\n"
    "Prints \"LISTENING <address>\" for each address it listens on; logs to stderr.\n"
    "  --listen ADDRESS         tcp://HOST:PORT (default tcp://0.0.0.0:7700; port 0 picks one)\n"
    "                           or unix:PATH; may be given more than once\n"
    "  --default-ttl-ms N       lease of registrations that ask for none (default 10000)\n"
    "  --max-endpoint-bytes N   largest endpoint a registrant may publish\n";

bool parseNumber(const char* text, uint64_t& out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return false;
  out = value;
  return true;
}

}  // namespace

int registryCommand(const char* program, int argc, char** argv) {
  std::vector<std::string> addresses;
  troupe::RegistryServerOptions options;
  auto level = spdlog::level::info;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      printf(USAGE, program);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: %s needs a value\n", program, flag.c_str());
      fprintf(stderr, USAGE, program);
      return 2;
    }
    const char* value = argv[++i];
    uint64_t number = 0;
    if (flag == "--listen") {
      addresses.push_back(value);
    } else if (flag == "--default-ttl-ms" && parseNumber(value, number) && number > 0) {
      options.defaultTtl = static_cast<int64_t>(number) * kj::MILLISECONDS;
    } else if (flag == "--max-endpoint-bytes" && parseNumber(value, number) && number > 0) {
      options.maxEndpointBytes = number;
    } else if (flag == "--log-level" && spdlog::level::from_str(value) != spdlog::level::off) {
      level = spdlog::level::from_str(value);
    } else if (flag == "--log-level" && std::string(value) == "off") {
      level = spdlog::level::off;
    } else {
      fprintf(stderr, "%s: bad argument %s %s\n", program, flag.c_str(), value);
      fprintf(stderr, USAGE, program);
      return 2;
    }
  }
  if (addresses.empty()) addresses.push_back("tcp://0.0.0.0:7700");

  // A daemon's logs go to stderr; stdout carries only the LISTENING lines.
  auto logger = spdlog::stderr_color_mt("registry");
  logger->set_level(level);
  spdlog::set_default_logger(logger);
  options.logger = spdlog::default_logger();

  troupe::EventLoop loop(troupe::EventLoopOptions{.logger = spdlog::default_logger()});
  troupe::RegistryServer server(loop, options);
  for (auto& address : addresses) {
    std::string bound;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { bound = server.listen(address.c_str()); })) {
      spdlog::error("cannot listen on {}: {}", address, e->getDescription().cStr());
      return 1;
    }
    printf("LISTENING %s\n", bound.c_str());
    fflush(stdout);
  }

  int signum = loop.onSignal({SIGTERM, SIGINT}).wait(loop.waitScope());
  spdlog::info("received {}; stopping", strsignal(signum));
  server.stop().wait(loop.waitScope());
  return 0;
}

}  // namespace troupe::cli
