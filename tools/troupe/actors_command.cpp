// troupe actors TARGET: the actors a server hosts, with their interfaces and methods.

#include <stdio.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <capnp/schema-loader.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/channel.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"
#include "tools/troupe/dynamic_actor.h"

namespace troupe::cli {

namespace {

void printMethods(capnp::InterfaceSchema schema, std::vector<uint64_t>& seen) {
  auto id = schema.getProto().getId();
  if (std::find(seen.begin(), seen.end(), id) != seen.end()) return;
  seen.push_back(id);
  for (auto method : schema.getMethods()) printf("    %s\n", describeMethod(method).c_str());
  for (auto super : schema.getSuperclasses()) printMethods(super, seen);
}

void listServer(EventLoop& loop, const std::string& address,
                const std::vector<std::string>& names) {
  auto channel = Channel::open(loop, address.c_str());
  auto actors = channel->host().listActorsRequest().send().wait(loop.waitScope());
  printf("%s", address.c_str());
  if (!names.empty()) {
    printf(" (");
    for (size_t i = 0; i < names.size(); ++i) printf("%s%s", i ? ", " : "", names[i].c_str());
    printf(")");
  }
  printf(": %u actor(s), incarnation %llu\n", actors.getActors().size(),
         static_cast<unsigned long long>(actors.getIncarnation()));
  capnp::SchemaLoader loader;
  for (auto info : actors.getActors()) {
    auto actor = openDynamicActor(*channel, info.getName(), loader).wait(loop.waitScope());
    printf("  %s: %s\n", info.getName().cStr(), info.getInterfaceName().cStr());
    std::vector<uint64_t> seen;
    printMethods(actor.schema, seen);
  }
}

class ActorsCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(
            kj::MainBuilder(
                context, VERSION_TEXT,
                "Lists the actors hosted where TARGET points, each with its interface and methods "
                "(parameter and result fields with their types). TARGET is an address "
                "(tcp://HOST:PORT, unix:PATH), an endpoint name (job/actor-0), or a prefix of "
                "endpoint names (every server under it).")
                .addOptionWithArg({"resolver"}, storeIn(resolver), "URL",
                                  "For endpoint names (default: $TROUPE_RESOLVER).")
                .expectArg("TARGET", storeIn(target)))
        .build();
  }

  int run() override {
    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    // Servers by address, with the endpoint names that point at each.
    std::map<std::string, std::vector<std::string>> servers;
    if (isAddress(target)) {
      servers[target];
    } else {
      auto& opened = command.resolver(resolver);
      for (auto& e : endpointsNamed(opened, target.c_str()).wait(loop.waitScope())) {
        servers[e.address].push_back(e.name);
      }
    }
    for (auto& [address, names] : servers) listServer(loop, address, names);
    return 0;
  }

private:
  std::string resolver;
  CredentialFlags credentialFlags;
  std::string target;
};

}  // namespace

kj::Own<Command> actorsCommand() { return kj::heap<ActorsCommand>(); }

}  // namespace troupe::cli
