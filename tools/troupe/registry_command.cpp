// `troupe registry` (and the troupe-registry daemon): runs a RegistryServer in the foreground.
//
//   troupe registry [--listen ADDRESS]... [--default-ttl DURATION] [--max-endpoint-bytes N]
//                   [--max-connections N] [--max-incomplete-bytes N]
//                   [--max-queued-event-bytes N] [--max-endpoints N] [--max-watchers N]
//                   [--max-jobs N] [--http HOST:PORT] [--history-interval DURATION]
//                   [--history-length DURATION] [--log-level LEVEL] [--insecure]
//                   [TLS and token flags]
//
// ADDRESS is "tcp://HOST:PORT", "tls://HOST:PORT" (port 0 picks a free one) or "unix:PATH";
// --listen may be given more than once. The default is tls://127.0.0.1:7700 with a TLS
// certificate, tcp://127.0.0.1:7700 without. An address other machines may reach needs
// credentials that authenticate clients (a cluster token, or mutual TLS), or --insecure.
// Prints "LISTENING <address>" on stdout for each address once it listens (scripts and tests
// wait for it), and "HTTP <url>" once the dashboard serves (--http), logs to stderr, and stops
// cleanly on SIGTERM or SIGINT (exit status 0). Exits 1 when it cannot listen, 2 on bad usage.

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#include <kj/debug.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/resolver/registry_server.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

class RegistryCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(
            kj::MainBuilder(
                context, VERSION_TEXT,
                "Runs the registry (troupe's default resolver) in the foreground until SIGTERM or "
                "SIGINT. Prints \"LISTENING <address>\" for each address it listens on; logs to "
                "stderr.")
                .addOptionWithArg(
                    {"listen"}, KJ_BIND_METHOD(*this, addListen), "ADDRESS",
                    "Listen on ADDRESS: tcp://HOST:PORT, tls://HOST:PORT (port 0 picks a "
                    "free one) or unix:PATH; may be given more than once. Default: "
                    "127.0.0.1:7700, over TLS when given a certificate.")
                .addOptionWithArg(
                    {"http"}, KJ_BIND_METHOD(*this, setHttp), "HOST:PORT",
                    "Serve the dashboard (/) and the registry's metrics (/metrics) over "
                    "HTTP on HOST:PORT (port 0 picks a free one). Like --listen, an "
                    "address other machines may reach needs a cluster token or "
                    "--insecure; with a token, the dashboard asks for it.")
                .addOptionWithArg({"history-interval"}, KJ_BIND_METHOD(*this, setHistoryInterval),
                                  "DURATION",
                                  "How often the dashboard's history reads every endpoint's "
                                  "metrics (default 5s; 0s keeps no history).")
                .addOptionWithArg({"history-length"}, KJ_BIND_METHOD(*this, setHistoryLength),
                                  "DURATION",
                                  "How far back the dashboard's history goes (default 15m).")
                .addOptionWithArg({"admin-token-file"}, storeIn(adminTokenFile), "FILE",
                                  "The administrator token, in a file of its owner's alone: "
                                  "who presents it may stop any job (troupe stop "
                                  "--admin-token-file), as the job's own token does. Default: "
                                  "$TROUPE_ADMIN_TOKEN_FILE; without one, only a job's owner "
                                  "may stop it.")
                .addOption(
                    {"insecure"},
                    [this]() {
                      insecure = true;
                      return true;
                    },
                    "Allow listening where other machines may connect without a cluster token "
                    "or client certificates: anyone who reaches the port can then change every "
                    "job's endpoints.")
                .addOptionWithArg({"default-ttl"}, KJ_BIND_METHOD(*this, setDefaultTtl), "DURATION",
                                  "The lease of registrations that ask for none (default 10s): "
                                  "every troupe client's, unless its resolver URL ends in "
                                  "?ttl_ms=N.")
                .addOptionWithArg({"max-endpoint-bytes"},
                                  KJ_BIND_METHOD(*this, setMaxEndpointBytes), "N",
                                  "The largest endpoint a registrant may publish, in bytes.")
                .addOptionWithArg(
                    {"max-connections"}, KJ_BIND_METHOD(*this, setMaxConnections), "N",
                    "Connections open at once (default 4096); one past it is closed as "
                    "it comes.")
                .addOptionWithArg({"max-incomplete-bytes"}, KJ_BIND_METHOD(*this, setMaxIncomplete),
                                  "N",
                                  "Bytes that messages still arriving may hold across connections "
                                  "(default 268435456); a message past it waits.")
                .addOptionWithArg({"max-queued-event-bytes"},
                                  KJ_BIND_METHOD(*this, setMaxQueuedEventBytes), "N",
                                  "Bytes of watch events queued for all watchers together (default "
                                  "67108864); past it the watcher furthest behind is cut off, and "
                                  "subscribes again.")
                .addOptionWithArg(
                    {"max-endpoints"}, KJ_BIND_METHOD(*this, setMaxEndpoints), "N",
                    "Endpoints registered at once (default 100000); past it new names "
                    "are refused as overloaded.")
                .addOptionWithArg(
                    {"max-watchers"}, KJ_BIND_METHOD(*this, setMaxWatchers), "N",
                    "Watches open at once (default 10000); past it new ones are refused "
                    "as overloaded.")
                .addOptionWithArg(
                    {"max-jobs"}, KJ_BIND_METHOD(*this, setMaxJobs), "N",
                    "Jobs remembered, live and ended (default 100000); past it the job "
                    "that ended first is forgotten.")
                .addOptionWithArg({"log-level"}, KJ_BIND_METHOD(*this, setLogLevel), "LEVEL",
                                  "trace, debug, info (the default), warn, error or off."),
            true)
        .build();
  }

  int run() override {
    // A daemon's logs go to stderr; stdout carries only the LISTENING lines.
    auto logger = spdlog::stderr_color_mt("registry");
    logger->set_level(level);
    spdlog::set_default_logger(logger);
    options.logger = spdlog::default_logger();

    auto adminTokenPath = flagOrEnvironment(adminTokenFile, "TROUPE_ADMIN_TOKEN_FILE");
    if (!adminTokenPath.empty()) {
      options.adminToken = readSecret("the administrator token file", adminTokenPath);
    }
    CommandLoop command(credentialFlags, {.logger = spdlog::default_logger()});
    auto& loop = command.loop;
    auto& credentials = *loopCredentials(loop);
    if (addresses.empty()) {
      addresses.push_back(credentials.canServeTls() ? "tls://127.0.0.1:7700"
                                                    : "tcp://127.0.0.1:7700");
    }
    RegistryServer server(loop, options);
    for (auto& address : addresses) {
      std::string bound;
      KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                    if (!insecure) {
                      refuseOpenListener(Address::parse(address.c_str()), credentials,
                                         "--insecure");
                    }
                    bound = server.listen(address.c_str());
                  })) {
        spdlog::error("cannot listen on {}: {}", address, errorMessage(*e).cStr());
        return 1;
      }
      printf("LISTENING %s\n", bound.c_str());
      fflush(stdout);
    }

    if (!httpAddress.empty()) {
      std::string url;
      KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                    if (!insecure) {
                      auto hostPort = kj::StringPtr(httpAddress.c_str());
                      if (hostPort.startsWith("http://")) hostPort = hostPort.slice(7);
                      if (hostPort.startsWith("https://")) hostPort = hostPort.slice(8);
                      refuseOpenListener(Address::parse(hostPort), credentials, "--insecure");
                    }
                    url = server.listenHttp(httpAddress.c_str());
                  })) {
        spdlog::error("cannot serve HTTP on {}: {}", httpAddress, errorMessage(*e).cStr());
        return 1;
      }
      printf("HTTP %s\n", url.c_str());
      fflush(stdout);
    }

    int signum = loop.onSignal({SIGTERM, SIGINT}).wait(loop.waitScope());
    spdlog::info("received {}; stopping", strsignal(signum));
    server.drain().wait(loop.waitScope());
    return 0;
  }

private:
  kj::MainBuilder::Validity setHttp(kj::StringPtr address) {
    httpAddress = address.cStr();
    return true;
  }

  kj::MainBuilder::Validity addListen(kj::StringPtr address) {
    addresses.push_back(address.cStr());
    return true;
  }

  kj::MainBuilder::Validity setDefaultTtl(kj::StringPtr text) {
    options.defaultTtl = parseDuration("--default-ttl", text);
    return true;
  }

  kj::MainBuilder::Validity setHistoryInterval(kj::StringPtr text) {
    options.historyInterval = parseDuration("--history-interval", text, 0 * kj::SECONDS);
    return true;
  }

  kj::MainBuilder::Validity setHistoryLength(kj::StringPtr text) {
    options.historyLength = parseDuration("--history-length", text);
    return true;
  }

  kj::MainBuilder::Validity setMaxEndpointBytes(kj::StringPtr text) {
    options.maxEndpointBytes = parseWhole("--max-endpoint-bytes", text, 1);
    return true;
  }

  kj::MainBuilder::Validity setMaxConnections(kj::StringPtr text) {
    auto n = parseWhole("--max-connections", text, 1);
    if (n > UINT32_MAX) throw UsageError{"--max-connections is at most 4294967295"};
    options.connections.maxConnections = static_cast<uint32_t>(n);
    return true;
  }

  kj::MainBuilder::Validity setMaxIncomplete(kj::StringPtr text) {
    options.connections.maxIncompleteMessageBytes = parseWhole("--max-incomplete-bytes", text, 1);
    return true;
  }

  kj::MainBuilder::Validity setMaxQueuedEventBytes(kj::StringPtr text) {
    options.maxQueuedEventBytes = parseWhole("--max-queued-event-bytes", text, 1);
    return true;
  }

  kj::MainBuilder::Validity setMaxEndpoints(kj::StringPtr text) {
    options.maxEndpoints = parseWhole("--max-endpoints", text, 1);
    return true;
  }

  kj::MainBuilder::Validity setMaxWatchers(kj::StringPtr text) {
    options.maxWatchers = parseWhole("--max-watchers", text, 1);
    return true;
  }

  kj::MainBuilder::Validity setMaxJobs(kj::StringPtr text) {
    options.maxJobs = parseWhole("--max-jobs", text, 1);
    return true;
  }

  kj::MainBuilder::Validity setLogLevel(kj::StringPtr text) {
    auto parsed = spdlog::level::from_str(text.cStr());
    // from_str() answers `off` for anything it does not know.
    if (parsed == spdlog::level::off && text != "off") {
      throw UsageError{kj::str("--log-level needs trace, debug, info, warn, error or off, not '",
                               printable(text), "'")
                           .cStr()};
    }
    level = parsed;
    return true;
  }

  std::vector<std::string> addresses;
  std::string httpAddress;
  std::string adminTokenFile;
  bool insecure = false;
  CredentialFlags credentialFlags;
  RegistryServerOptions options;
  spdlog::level::level_enum level = spdlog::level::info;
};

}  // namespace

kj::Own<Command> registryCommand() { return kj::heap<RegistryCommand>(); }

}  // namespace troupe::cli
