// troupe call TARGET ACTOR.METHOD 'JSON'|@FILE|- [--all] [--partial]: calls an actor's method
// without its generated code, and prints the results as JSON. With --all over endpoint names,
// through the pool's broadcast to every READY member of the job's group for ACTOR.

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include <capnp/schema-loader.h>
#include <kj/debug.h>

#include "troupe/actor/actor_ref.h"
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

// All of what the file descriptor `fd` reads until its end; `what` names it in errors ("'p.json'",
// "standard input"). Throws INVALID_ARGUMENT with the system's reason when a read fails, and
// when the text holds a NUL byte, which no JSON text has.
std::string readAll(int fd, kj::StringPtr what) {
  std::string text;
  char buffer[65536];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("cannot read the JSON parameters from ", what, ": ", strerror(errno)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  auto nul = text.find('\0');
  if (nul != std::string::npos) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("the JSON parameters from ", what, " hold a NUL byte (at byte ", nul + 1,
                       "), which JSON text never does"));
  }
  return text;
}

// The JSON text the JSON argument stands for: the argument itself, the contents of FILE for
// "@FILE", or all of standard input for "-". Throws INVALID_ARGUMENT naming the file and the
// system's reason when it cannot be read, UsageError for "@" without a file name.
std::string paramsJson(const std::string& argument) {
  if (argument == "-") return readAll(STDIN_FILENO, "standard input");
  if (argument.empty() || argument[0] != '@') return argument;
  auto path = argument.substr(1);
  if (path.empty()) throw UsageError{"'@' needs a file name: @FILE reads the JSON from FILE"};
  auto what = kj::str("'", printable(path), "'");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("cannot read the JSON parameters from ", what, ": ", strerror(errno)));
  }
  KJ_DEFER(::close(fd));
  return readAll(fd, what);
}

// Calls `actor`'s `method` at one server, with the parameters in `json`. The call goes with an
// id (ActorRefBase::sendOnce()): when the connection breaks under it, it is made again and the
// call sent again, and the server runs it once. Connecting, fetching the schema and the call
// count against `deadline`.
kj::Promise<std::string> callOne(EventLoop& loop, const Target& target, std::string actor,
                                 std::string method, std::string json, MissingParams missing,
                                 kj::Duration deadline) {
  ActorRefOptions options;
  options.metrics = false;
  ActorRefBase ref(Channel::open(loop, target.address.c_str()), actor.c_str(), options);
  auto loader = kj::heap<capnp::SchemaLoader>();
  auto opened = openDynamicActor(ref.channel(), actor.c_str(), *loader);
  auto call = opened.then([ref, method = kj::mv(method), json = kj::mv(json),
                           missing](DynamicActor actor) mutable {
    using Response = capnp::Response<capnp::DynamicStruct>;
    auto request = kj::heap<JsonCall>(actor, method.c_str(), json.c_str(), missing);
    auto sent = ref.sendOnce<Response>(
        [&request = *request](capnp::Capability::Client c) -> kj::Promise<Response> {
          return request.send(kj::mv(c));
        });
    return sent
        .then([&request = *request](Response&& response) { return request.resultsJson(response); })
        .attach(kj::mv(request));
  });
  return by(loop, loop.timer().now() + deadline, deadline, kj::str(target.name, " gave no answer"),
            kj::mv(call))
      .attach(kj::mv(ref), kj::mv(loader));
}

class CallCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(
            kj::MainBuilder(
                context, VERSION_TEXT,
                "Calls METHOD of the actor named ACTOR with the parameters in JSON, an object "
                "naming every parameter (default {}), and prints the results as JSON; Data "
                "travels as base64 strings, 64-bit integers as numbers up to 2^53 and as strings "
                "beyond. JSON may be @FILE to read it from FILE, or - to read it from standard "
                "input. The server sends the actor's schema: no generated code is needed. TARGET "
                "is an address (tcp://HOST:PORT, unix:PATH), an endpoint name (job/actor-0), or "
                "a prefix of endpoint names: then one READY member is called, or with --all "
                "every member, printing \"<endpoint> <json>\" per member (exit 1 if any failed).")
                .addOption(
                    {"all"},
                    [this]() {
                      all = true;
                      return true;
                    },
                    "Call every READY member of the job TARGET names for ACTOR (its endpoints "
                    "<job>/ACTOR-<index>) at once, through a pool's broadcast; TARGET is then the "
                    "job (calc/), or a prefix of all its members, or one endpoint.")
                .addOption(
                    {"partial"},
                    [this]() {
                      missing = MissingParams::DEFAULT;
                      return true;
                    },
                    "Let the parameters JSON leaves out take their defaults, rather than refusing "
                    "the call.")
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
    json = paramsJson(json);  // before connecting: a file that cannot be read fails at once
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
    // A member on this host through its same-host socket, as a group would (README, "Same host").
    return callOneAndPrint(loop, {chosen.name, connectAddress(chosen)});
  }

private:
  // Calls one server. Prints the results; with --all, as "<name> <json>" or "<name> error: ...".
  int callOneAndPrint(EventLoop& loop, const Target& one) {
    auto call = callOne(loop, one, actor, method, json, missing, deadline);
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
    JsonCall call(dynamicActor, method.c_str(), json.c_str(), missing);

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
  MissingParams missing = MissingParams::REFUSE;
  kj::Duration deadline = 30 * kj::SECONDS;
  std::string resolver;
  CredentialFlags credentialFlags;
  std::string target;
  std::string actor;
  std::string method;
  std::string json = "{}";  // the JSON argument, then (run()) the text it stands for
};

}  // namespace

kj::Own<Command> callCommand() { return kj::heap<CallCommand>(); }

}  // namespace troupe::cli
