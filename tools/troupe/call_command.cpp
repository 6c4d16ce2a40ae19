// troupe call TARGET ACTOR.METHOD 'JSON' [--all]: calls an actor's method without its generated
// code, and prints the results as JSON.

#include <stdio.h>
#include <stdlib.h>

#include <random>
#include <string>
#include <vector>

#include <capnp/schema-loader.h>
#include <kj/debug.h>

#include "troupe/actor/channel.h"
#include "troupe/actor/errors.h"
#include "troupe/actor/event_loop.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"
#include "tools/troupe/dynamic_actor.h"

namespace troupe::cli {

namespace {

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

class CallCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return kj::MainBuilder(
               context, VERSION_TEXT,
               "Calls METHOD of the actor named ACTOR with the parameters in JSON (an object; "
               "default {}) and prints the results as JSON; Data travels as base64 strings. The "
               "server sends the actor's schema: no generated code is needed. TARGET is an "
               "address (tcp://HOST:PORT, unix:PATH), an endpoint name (job/actor-0), or a prefix "
               "of endpoint names: then one READY member is called, or with --all every member, "
               "printing \"<endpoint> <json>\" per member (exit 1 if any failed).")
        .addOption({"all"}, [this]() { all = true; return true; },
                   "Call every READY member under TARGET.")
        .addOptionWithArg({"timeout"}, [this](kj::StringPtr text) {
              deadline = parseSeconds("--timeout", text);
              return true;
            }, "SECONDS", "The deadline of each call (default 30).")
        .addOptionWithArg({"resolver"}, [this](kj::StringPtr url) {
              resolver = url.cStr();
              return true;
            }, "URL", "For endpoint names (default: $TROUPE_RESOLVER).")
        .expectArg("TARGET", [this](kj::StringPtr text) {
              target = text.cStr();
              return true;
            })
        .expectArg("ACTOR.METHOD", KJ_BIND_METHOD(*this, setActorMethod))
        .expectOptionalArg("JSON", [this](kj::StringPtr text) {
              json = text.cStr();
              return true;
            })
        .build();
  }

  int run() override {
    EventLoop loop;
    std::vector<Target> targets;
    if (isAddress(target)) {
      targets.push_back({target, target});
    } else {
      auto opened = openResolver(loop, resolverUrl(resolver).c_str());
      auto found = endpointsNamed(*opened, target.c_str()).wait(loop.waitScope());
      for (auto& e : found) {
        if (e.state == EndpointState::READY) targets.push_back({e.name, e.address});
      }
      if (targets.empty()) {
        throwError(ErrorCode::NO_ENDPOINTS,
                   kj::str("none of the ", found.size(), " endpoint(s) under '", target.c_str(),
                           "' is READY"));
      }
    }

    if (!all) {
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
  }

private:
  kj::MainBuilder::Validity setActorMethod(kj::StringPtr text) {
    KJ_IF_MAYBE(dot, text.findLast('.')) {
      if (*dot > 0 && *dot + 1 < text.size()) {
        actor = std::string(text.begin(), *dot);
        method = text.slice(*dot + 1).cStr();
        return true;
      }
    }
    throw UsageError{kj::str("'", printable(text), "' is not ACTOR.METHOD").cStr()};
  }

  bool all = false;
  kj::Duration deadline = 30 * kj::SECONDS;
  std::string resolver;
  std::string target;
  std::string actor;
  std::string method;
  std::string json = "{}";
};

}  // namespace

kj::Own<Command> callCommand() { return kj::heap<CallCommand>(); }

}  // namespace troupe::cli
