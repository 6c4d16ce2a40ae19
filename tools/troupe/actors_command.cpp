// troupe actors TARGET: the actors a server hosts, with their interfaces and methods.

#include <stdio.h>

#include <map>
#include <string>
#include <vector>

#include <capnp/schema-loader.h>

#include "troupe/actor/channel.h"
#include "troupe/actor/event_loop.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"
#include "tools/troupe/dynamic_actor.h"

namespace troupe::cli {

namespace {

constexpr const char* USAGE =
    "usage: troupe actors TARGET [--resolver URL]\n"
    "Lists the actors hosted where TARGET points, each with its interface and methods (parameter\n"
    "and result fields with their types). TARGET is an address (tcp://HOST:PORT, unix:PATH), an\n"
    "endpoint name (job/actor-0), or a prefix of endpoint names (every server under it).\n"
    "  --resolver URL   for endpoint names (default: $TROUPE_RESOLVER)\n";

void printMethods(capnp::InterfaceSchema schema, std::vector<uint64_t>& seen) {
  auto id = schema.getProto().getId();
  if (std::find(seen.begin(), seen.end(), id) != seen.end()) return;
  seen.push_back(id);
  for (auto method : schema.getMethods()) printf("    %s\n", describeMethod(method).c_str());
  for (auto super : schema.getSuperclasses()) printMethods(super, seen);
}

void listServer(EventLoop& loop, const std::string& address, const std::vector<std::string>& names) {
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

}  // namespace

int actorsCommand(int argc, char** argv) {
  return runCommand("actors", USAGE, [&]() {
    Args args(argc, argv, {}, {"--resolver"});
    if (args.has("--help")) {
      fputs(USAGE, stdout);
      return 0;
    }
    if (args.positional.size() != 1) throw UsageError{"one TARGET is needed"};
    auto target = args.positional[0];
    EventLoop loop;
    // Servers by address, with the endpoint names that point at each.
    std::map<std::string, std::vector<std::string>> servers;
    if (isAddress(target)) {
      servers[target];
    } else {
      auto resolver = openResolver(loop, resolverUrl(args).c_str());
      for (auto& e : endpointsNamed(*resolver, target.c_str()).wait(loop.waitScope())) {
        servers[e.address].push_back(e.name);
      }
    }
    for (auto& [address, names] : servers) listServer(loop, address, names);
    return 0;
  });
}

}  // namespace troupe::cli
