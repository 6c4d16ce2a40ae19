// troupe call TARGET ACTOR.METHOD 'JSON' [--all]: calls an actor's method without its generated
// code, and prints the results as JSON. With --all over endpoint names, through the pool's
// broadcast to every READY member of the job's group for ACTOR.

#include <stdio.h>
#include <stdlib.h>

#include <set>
#include <string>
#include <vector>

#include <capnp/schema-loader.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/net/channel.h"
#include "troupe/pool/actor_group.h"
#include "troupe/pool/actor_pool.h"
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

// `promise`, or DEADLINE_EXCEEDED ("<what> within <limit>") if it has not settled by `until`.
template <typename T>
kj::Promise<T> by(EventLoop& loop, kj::TimePoint until, kj::Duration limit, kj::String what,
                  kj::Promise<T> promise) {
  auto expired = loop.timer().atTime(until).then([what = kj::mv(what), limit]() -> kj::Promise<T> {
    return makeError(ErrorCode::DEADLINE_EXCEEDED, kj::str(what, " within ", limit));
  });
  return promise.exclusiveJoin(kj::mv(expired));
}

// One call on one server, from connecting to the JSON it answered.
kj::Promise<std::string> callOne(EventLoop& loop, const Target& target, std::string actor,
                                 std::string method, std::string json, kj::Duration deadline) {
  auto channel = Channel::open(loop, target.address.c_str());
  auto loader = kj::heap<capnp::SchemaLoader>();
  auto opened = openDynamicActor(*channel, actor.c_str(), *loader);
  auto call = opened.then(
      [&loop, method = kj::mv(method), json = kj::mv(json), deadline](DynamicActor actor) {
        auto holder = kj::heap<DynamicActor>(kj::mv(actor));
        auto promise = callWithJson(*holder, method.c_str(), json.c_str(), deadline, loop.timer());
        return promise.attach(kj::mv(holder));
      });
  // Connecting and fetching the schema count against the deadline too.
  return by(loop, loop.timer().now() + deadline, deadline, kj::str(target.name, " gave no answer"),
            kj::mv(call))
      .attach(kj::mv(channel), kj::mv(loader));
}

class CallCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(
            kj::MainBuilder(
                context, VERSION_TEXT,
                "Calls METHOD of the actor named ACTOR with the parameters in JSON (an object; "
                "default {}) and prints the results as JSON; Data travels as base64 strings. The "
                "server sends the actor's schema: no generated code is needed. TARGET is an "
                "address (tcp://HOST:PORT, unix:PATH), an endpoint name (job/actor-0), or a prefix "
                "of endpoint names: then one READY member is called, or with --all every member, "
                "printing \"<endpoint> <json>\" per member (exit 1 if any failed).")
                .addOption(
                    {"all"},
                    [this]() {
                      all = true;
                      return true;
                    },
                    "Call every READY member of the job TARGET names for ACTOR (its endpoints "
                    "<job>/ACTOR-<index>) at once, through a pool's broadcast; TARGET is then the "
                    "job (calc/), or a prefix of all its members, or one endpoint.")
                .addOptionWithArg(
                    {"timeout"},
                    [this](kj::StringPtr text) {
                      deadline = parseDuration("--timeout", text);
                      return true;
                    },
                    "DURATION",
                    "Deadline of the call, connecting and fetching the schema included; with "
                    "--all, of finding the members and calling them all (default 30s).")
                .addOptionWithArg({"resolver"}, storeIn(resolver), "URL",
                                  "For endpoint names (default: $TROUPE_RESOLVER).")
                .expectArg("TARGET", storeIn(target))
                .expectArg("ACTOR.METHOD", KJ_BIND_METHOD(*this, setActorMethod))
                .expectOptionalArg("JSON", storeIn(json)))
        .build();
  }

  int run() override {
    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    if (isAddress(target)) return callOneAndPrint(loop, {target, target});
    auto& opened = command.resolver(resolver);
    auto found = endpointsNamed(opened, target.c_str()).wait(loop.waitScope());
    std::vector<Endpoint> ready;
    for (auto& e : found) {
      if (e.state == EndpointState::READY) ready.push_back(e);
    }
    if (ready.empty()) {
      throwError(ErrorCode::NO_ENDPOINTS,
                 kj::str("none of the ", found.size(), " endpoint(s) under '", target.c_str(),
                         "' is READY"));
    }
    bool oneEndpoint = ready.size() == 1 && ready[0].name == target;
    if (all && !oneEndpoint) return broadcast(loop, opened, ready);
    // Any one member: a different one each time, as a pool would spread calls.
    auto& chosen = ready[loop.random().below(ready.size())];
    return callOneAndPrint(loop, {chosen.name, chosen.address});
  }

private:
  // Calls one server. Prints the results; with --all, as "<name> <json>" or "<name> error: ...".
  int callOneAndPrint(EventLoop& loop, const Target& one) {
    auto call = callOne(loop, one, actor, method, json, deadline);
    if (!all) {
      printf("%s\n", call.wait(loop.waitScope()).c_str());
      return 0;
    }
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  auto results = call.wait(loop.waitScope());
                  printf("%s %s\n", one.name.c_str(), results.c_str());
                })) {
      printf("%s error: %s\n", one.name.c_str(), errorMessage(*e).cStr());
      return 1;
    }
    return 0;
  }

  // --all over endpoint names: the pool's broadcast to every READY member of the job's group
  // for ACTOR that the group sees once it has the resolver's view. Finding the members,
  // fetching the schema and the calls all count against the one deadline.
  int broadcast(EventLoop& loop, Resolver& resolver, const std::vector<Endpoint>& ready) {
    auto until = loop.timer().now() + deadline;
    auto job = broadcastJob(ready);
    ActorGroupBase group(loop, resolver, job, actor);
    by(loop, until, deadline, kj::str("the members of ", job, "/", actor, "- were not listed"),
       group.whenSynced())
        .wait(loop.waitScope());
    auto members = group.readyMembers();
    if (members.size() == 0) {
      throwError(ErrorCode::NO_ENDPOINTS,
                 kj::str("no member of ", job, "/", actor, "- is READY any more"));
    }

    // The interface, from the first member; the JsonCall checks the method and the parameters
    // before anything is sent.
    ActorRefBase first = members[0]->ref;
    capnp::SchemaLoader loader;
    auto dynamicActor = by(loop, until, deadline,
                           kj::str(members[0]->endpoint.name, " sent no schema"),
                           openDynamicActor(first.channel(), actor, loader))
                            .wait(loop.waitScope());
    JsonCall call(dynamicActor, method.c_str(), json.c_str());

    ActorPoolBase pool(group);  // before `call` goes, the pool and its calls have gone
    auto left = until - loop.timer().now();
    auto results = pool.broadcastCapability(
                           [&call](capnp::Capability::Client c) { return call.send(kj::mv(c)); },
                           CallOptions{.deadline = left})
                       .waitAll(left)
                       .wait(loop.waitScope());
    int status = 0;
    for (auto& r : results) {
      KJ_IF_MAYBE(response, r.value) {
        printf("%s %s\n", r.endpoint.name.c_str(), call.resultsJson(*response).c_str());
      } else KJ_IF_MAYBE(e, r.error) {
        printf("%s error: %s\n", r.endpoint.name.c_str(),
               messageWithout(*e, kj::str(r.endpoint.name, " (", r.endpoint.address, ")")).cStr());
        status = 1;
      }
    }
    return status;
  }

  // The one job whose members for ACTOR `ready` lists, all of them under TARGET. --all calls a
  // whole group (a job's members for one actor), so TARGET must not narrow it further.
  std::string broadcastJob(const std::vector<Endpoint>& ready) {
    std::set<std::string> jobs;
    for (auto& e : ready) {
      if (e.actor == actor) jobs.insert(e.jobId);
    }
    if (jobs.empty()) {
      throwError(ErrorCode::NO_ENDPOINTS,
                 kj::str("no READY endpoint under '", target.c_str(), "' hosts actor '",
                         actor.c_str(), "' (its endpoints are named <job>/", actor.c_str(),
                         "-<index>)"));
    }
    if (jobs.size() > 1) {
      std::string names;
      for (auto& j : jobs) names += (names.empty() ? "" : ", ") + j;
      throw UsageError{"--all calls the members of one job, and '" + target + "' spans several (" +
                       names + "): name the job, e.g. '" + *jobs.begin() + "/'"};
    }
    auto job = *jobs.begin();
    auto groupPrefix = job + "/" + actor + "-";
    if (groupPrefix.rfind(target, 0) != 0) {
      throw UsageError{"--all calls every member of job '" + job + "' for actor '" + actor +
                       "', and '" + target + "' names only some of them: name the job ('" + job +
                       "/') or one endpoint"};
    }
    return job;
  }

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
  CredentialFlags credentialFlags;
  std::string target;
  std::string actor;
  std::string method;
  std::string json = "{}";
};

}  // namespace

kj::Own<Command> callCommand() { return kj::heap<CallCommand>(); }

}  // namespace troupe::cli
