// troupe call TARGET ACTOR.METHOD 'JSON' [--all]: calls an actor's method without its generated
// code, and prints the results as JSON.

#include <stdio.h>
#include <stdlib.h>

#include <random>
#include <string>
#include <vector>

#include <capnp/schema-loader.h>

#include "troupe/actor/channel.h"
#include "troupe/actor/errors.h"
#include "troupe/actor/event_loop.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"
#include "tools/troupe/dynamic_actor.h"

namespace troupe::cli {

namespace {

constexpr const char* USAGE =
    "usage: troupe call TARGET ACTOR.METHOD [JSON] [--all] [--timeout SECONDS] [--resolver URL]\n"
    "Calls METHOD of the actor named ACTOR with the parameters in JSON (an object; default {})\n"
    "and prints the results as JSON. The server sends the actor's schema: no generated code is\n"
    "needed. TARGET is an address (tcp://HOST:PORT, unix:PATH), an endpoint name (job/actor-0),\n"
    "or a prefix of endpoint names: then one READY member is called, or with --all every member,\n"
    "printing \"<endpoint> <json>\" per member (exit 1 if any failed).\n"
    "  --timeout SECONDS   deadline of each call (default 30)\n"
    "  --resolver URL      for endpoint names (default: $TROUPE_RESOLVER)\n";

struct Target {
  std::string name;  // the endpoint's name, or the address when given one
  std::string address;
};

// One call on one server, from connecting to the JSON it answered.
kj::Promise<std::string> callOne(EventLoop& loop, const Target& target, std::string actor,
                                 std::string method, std::string json, kj::Duration deadline) {
  auto channel = Channel::open(loop, target.address.c_str());
  auto loader = kj::heap<capnp::SchemaLoader>();
  auto opened = openDynamicActor(*channel, actor.c_str(), *loader);
  auto call = opened.then([&loop, method = kj::mv(method), json = kj::mv(json),
                           deadline](DynamicActor actor) {
    auto holder = kj::heap<DynamicActor>(kj::mv(actor));
    auto promise = callWithJson(*holder, method.c_str(), json.c_str(), deadline, loop.timer());
    return promise.attach(kj::mv(holder));
  });
  // Connecting and fetching the schema count against the deadline too.
  return loop.timer().timeoutAfter(deadline, kj::mv(call))
      .catch_([deadline, where = target.name](kj::Exception&& e) -> kj::Promise<std::string> {
        if (e.getType() == kj::Exception::Type::OVERLOADED &&
            e.getDescription().startsWith("operation timed out")) {
          return makeError(ErrorCode::DEADLINE_EXCEEDED,
                           kj::str(where.c_str(), " gave no answer within ", deadline));
        }
        return kj::mv(e);
      })
      .attach(kj::mv(channel), kj::mv(loader));
}

}  // namespace

int callCommand(int argc, char** argv) {
  return runCommand("call", USAGE, [&]() {
    Args args(argc, argv, {"--all"}, {"--timeout", "--resolver"});
    if (args.has("--help")) {
      fputs(USAGE, stdout);
      return 0;
    }
    if (args.positional.size() < 2 || args.positional.size() > 3) {
      throw UsageError{"TARGET and ACTOR.METHOD are needed, then optionally JSON"};
    }
    auto target = args.positional[0];
    auto actorMethod = args.positional[1];
    auto dot = actorMethod.rfind('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == actorMethod.size()) {
      throw UsageError{"'" + actorMethod + "' is not ACTOR.METHOD"};
    }
    std::string actor = actorMethod.substr(0, dot);
    std::string method = actorMethod.substr(dot + 1);
    std::string json = args.positional.size() == 3 ? args.positional[2] : "{}";
    double seconds = args.decimal("--timeout", 30);
    auto deadline = static_cast<int64_t>(seconds * 1000) * kj::MILLISECONDS;

    EventLoop loop;
    std::vector<Target> targets;
    if (isAddress(target)) {
      targets.push_back({target, target});
    } else {
      auto resolver = openResolver(loop, resolverUrl(args).c_str());
      auto found = endpointsNamed(*resolver, target.c_str()).wait(loop.waitScope());
      for (auto& e : found) {
        if (e.state == EndpointState::READY) targets.push_back({e.name, e.address});
      }
      if (targets.empty()) {
        throwError(ErrorCode::NO_ENDPOINTS,
                   kj::str("none of the ", found.size(), " endpoint(s) under '", target.c_str(),
                           "' is READY"));
      }
    }

    if (!args.has("--all")) {
      // Any one member: a different one each time, as a pool would spread calls.
      std::random_device seed;
      auto& chosen = targets[std::uniform_int_distribution<size_t>(0, targets.size() - 1)(seed)];
      auto result = callOne(loop, chosen, actor, method, json, deadline).wait(loop.waitScope());
      printf("%s\n", result.c_str());
      return 0;
    }

    auto calls = kj::heapArrayBuilder<kj::Promise<std::string>>(targets.size());
    for (auto& t : targets) {
      calls.add(callOne(loop, t, actor, method, json, deadline)
                    .catch_([](kj::Exception&& e) -> std::string {
                      return std::string("error: ") + errorMessage(e).cStr();
                    }));
    }
    auto results = kj::joinPromises(calls.finish()).wait(loop.waitScope());
    int status = 0;
    for (size_t i = 0; i < targets.size(); ++i) {
      printf("%s %s\n", targets[i].name.c_str(), results[i].c_str());
      if (results[i].rfind("error: ", 0) == 0) status = 1;
    }
    return status;
  });
}

}  // namespace troupe::cli
