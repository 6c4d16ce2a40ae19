// troupe ls [PREFIX] [--watch]: the endpoints a resolver holds, or a stream of their changes.

#include <signal.h>
#include <stdio.h>

#include <string>
#include <vector>

#include "troupe/base/event_loop.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

void printTable(const kj::Array<Endpoint>& endpoints, kj::Date now) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"NAME", "ADDRESS", "STATE", "INCARNATION", "AGE"});
  for (auto& e : endpoints) {
    rows.push_back({e.name, e.address, toString(e.state).cStr(), std::to_string(e.incarnation),
                    formatAge(e.registeredAtMillis, now)});
  }
  printRows(rows, true, "(no endpoints)");
}

kj::Promise<void> printEvents(Watch& watch) {
  return watch.next().then([&watch](WatchEvent event) {
    auto& e = event.endpoint;
    switch (event.type) {
      case WatchEvent::Type::ADDED:
      case WatchEvent::Type::CHANGED:
        printf("%s %s %s %s %llu\n", toString(event.type).cStr(), e.name.c_str(), e.address.c_str(),
               toString(e.state).cStr(), static_cast<unsigned long long>(e.incarnation));
        break;
      case WatchEvent::Type::REMOVED:
        printf("REMOVED %s\n", e.name.c_str());
        break;
      case WatchEvent::Type::SYNCED:
        printf("SYNCED\n");
        break;
      case WatchEvent::Type::JOB_ENDED:
        printf("JOB_ENDED %s %s\n", event.job.jobId.c_str(), event.job.reason.c_str());
        break;
    }
    fflush(stdout);
    return printEvents(watch);
  });
}

class LsCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(
            kj::MainBuilder(
                context, VERSION_TEXT,
                "Lists the endpoints whose names start with PREFIX (default: all): name, address, "
                "state, incarnation and age. With --watch, prints them and then each change as it "
                "happens (ADDED, CHANGED, REMOVED, JOB_ENDED) until interrupted.")
                .addOption(
                    {"watch"},
                    [this]() {
                      watching = true;
                      return true;
                    },
                    "Print each change as it happens, until interrupted.")
                .addOptionWithArg({"resolver"}, storeIn(resolver), "URL",
                                  "registry://HOST:PORT, registry+unix:PATH, etcd://HOST:PORT, "
                                  "etcds://HOST:PORT, "
                                  "etcd+unix:PATH, fixed:..., file:PATH (default: "
                                  "$TROUPE_RESOLVER).")
                .expectOptionalArg("PREFIX", storeIn(prefix)))
        .build();
  }

  int run() override {
    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    auto& opened = command.resolver(resolver);
    if (!watching) {
      auto endpoints = opened.resolve(prefix.c_str()).wait(loop.waitScope());
      printTable(endpoints, loop.calendarNow());
      return 0;
    }
    auto watch = opened.watch(prefix.c_str());
    auto stopped = loop.onSignal({SIGINT, SIGTERM}).ignoreResult();
    printEvents(*watch).exclusiveJoin(kj::mv(stopped)).wait(loop.waitScope());
    return 0;
  }

private:
  bool watching = false;
  std::string resolver;
  CredentialFlags credentialFlags;
  std::string prefix;
};

}  // namespace

kj::Own<Command> lsCommand() { return kj::heap<LsCommand>(); }

}  // namespace troupe::cli
