#include "python/src/client.h"

#include <algorithm>
#include <cmath>

#include <kj/debug.h>

#include "troupe/actor/blob_device.h"
#include "troupe/actor/dynamic_actor.h"
#include "troupe/base/errors.h"
#include "troupe/net/bytes.h"
#include "troupe/net/limits.h"
#include "troupe/resolver/open_resolver.h"
#include "python/src/device.h"
#include "python/src/errors.h"
#include "python/src/values.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

std::string stateName(EndpointState state) { return toString(state).cStr(); }

// The response `r`, copied into a message of its own that any thread may read. Its large Data
// are not copied: the copy refers to the received message's memory, which `kept` keeps.
kj::Own<capnp::MallocMessageBuilder> copyOf(capnp::DynamicStruct::Reader r,
                                            const KeptReceived& kept) {
  auto words = r.totalSize().wordCount;
  if (words * sizeof(capnp::word) < KEPT_RECEIVED_MIN_BYTES) {
    auto message = kj::heap<capnp::MallocMessageBuilder>(words + 8);
    message->setRoot(r);
    return message;
  }
  auto message = kj::heap<capnp::MallocMessageBuilder>();
  copyStruct(r, message->initRoot<capnp::DynamicStruct>(r.getSchema()), &kept);
  return message;
}

// Sends `call` on `capability`: a request of its method with its parameters.
capnp::RemotePromise<capnp::DynamicStruct> send(const PreparedCall& call,
                                                capnp::Capability::Client capability) {
  auto request = capability.castAs<capnp::DynamicCapability>(call.method.schema)
                     .newRequest(call.method.method);
  auto params = const_cast<capnp::MallocMessageBuilder&>(call.params)
                    .getRoot<capnp::DynamicStruct>(call.method.method.getParamType());
  copyStruct(params.asReader(), request, &call.borrowed);
  return request.send();
}

}  // namespace

kj::Duration durationOf(double seconds, const char* what) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) {
    raiseInvalidArgument(std::string(what) + " must be a finite number of seconds, at least 0");
  }
  // Past a century is as good as forever, and keeps the nanoseconds within int64.
  constexpr double CENTURY = 100.0 * 365 * 24 * 3600;
  return static_cast<int64_t>(std::min(seconds, CENTURY) * 1e9) * kj::NANOSECONDS;
}

// ---------------------------------------------------------------------------------------------
// PyResolver, PyGroup

namespace {

// Credentials from `files`, or null (the loop's) when none is given. The job credential a
// replica holds (TROUPE_JOB_ID, TROUPE_JOB_TOKEN_FILE) is kept either way.
std::shared_ptr<Credentials> credentialsOf(const ClientCredentialFiles& files) {
  if (files.tokenFile.empty() && files.tlsCa.empty() && files.tlsCert.empty() &&
      files.tlsKey.empty() && files.tlsServerName.empty()) {
    return nullptr;
  }
  auto environment = Credentials::optionsFromEnvironment();
  CredentialsOptions options;
  options.jobId = kj::mv(environment.jobId);
  options.jobToken = kj::mv(environment.jobToken);
  options.jobTokenFile = kj::mv(environment.jobTokenFile);
  options.tokenFile = files.tokenFile;
  if (!files.tlsCa.empty() || !files.tlsCert.empty() || !files.tlsKey.empty() ||
      !files.tlsServerName.empty()) {
    TlsOptions tls;
    tls.caFile = files.tlsCa;
    tls.certFile = files.tlsCert;
    tls.keyFile = files.tlsKey;
    tls.serverName = files.tlsServerName;
    options.tls = kj::mv(tls);
  }
  return std::make_shared<Credentials>(kj::mv(options));
}

}  // namespace

PyResolver::PyResolver(const std::string& url, const ClientCredentialFiles& files) : url(url) {
  auto done = kj::atomicRefcounted<Completion>();
  runOn<Completion>(done, [this, &files](EventLoop& loop, Completion&) {
    credentials = credentialsOf(files);
    resolver.set(openResolver(loop, this->url.c_str(), credentials));
    return kj::READY_NOW;
  });
}

PyGroup::PyGroup(std::shared_ptr<PyResolver> r, const std::string& job, const std::string& actor)
    : resolver(kj::mv(r)), job(job), actor(actor) {
  auto done = kj::atomicRefcounted<Completion>();
  runOn<Completion>(done, [this](EventLoop& loop, Completion&) {
    ActorGroupOptions options;
    options.channel.credentials = resolver->credentials;
    group.set(kj::heap<ActorGroupBase>(loop, resolver->resolver.get(), this->job.c_str(),
                                       this->actor.c_str(), kj::mv(options)));
    return kj::READY_NOW;
  });
}

namespace {

struct EndpointsCompletion final : public Completion {
  kj::Array<Endpoint> endpoints;
};

py::list endpointList(kj::ArrayPtr<const Endpoint> endpoints, bool namesOnly) {
  py::list out;
  for (auto& e : endpoints) {
    if (namesOnly) {
      out.append(py::str(e.name));
      continue;
    }
    py::dict d;
    d["name"] = e.name;
    d["address"] = e.address;
    d["state"] = stateName(e.state);
    d["incarnation"] = e.incarnation;
    py::dict metadata;
    for (auto& [k, v] : e.metadata) metadata[py::str(k)] = py::str(v);
    d["metadata"] = metadata;
    out.append(d);
  }
  return out;
}

struct JobsCompletion final : public Completion {
  kj::Array<JobInfo> jobs;
};

py::object secondsOrNone(int64_t millis) {
  if (millis <= 0) return py::none();
  return py::float_(static_cast<double>(millis) / 1000.0);
}

py::list jobList(kj::ArrayPtr<const JobInfo> jobs) {
  py::list out;
  for (auto& j : jobs) {
    py::dict d;
    d["name"] = j.status.jobId;
    d["state"] = jobOutcome(j.status).cStr();
    d["reason"] = j.status.reason;
    d["launcher"] = j.launcher;
    d["replicas"] = j.replicas;
    d["ready"] = j.ready;
    d["endpoints"] = j.endpoints;
    d["created_at"] = secondsOrNone(j.createdAtMillis);
    d["ended_at"] = secondsOrNone(j.endedAtMillis);
    out.append(d);
  }
  return out;
}

// Runs `ask` (a request to the resolver, on the loop) for Python: fails with DEADLINE_EXCEEDED
// after `timeout` seconds, raises what it fails with, else returns the completion.
template <typename Out, typename Ask>
kj::Own<Out> askResolver(std::shared_ptr<PyResolver> self, double timeout, Ask ask) {
  auto limit = durationOf(timeout, "timeout");
  auto done = kj::atomicRefcounted<Out>();
  python::start(*done, [self = kj::mv(self), limit, ask = kj::mv(ask)](EventLoop& loop,
                                                                       Completion& c) mutable {
    auto asked = ask(self->resolver.get(), static_cast<Out&>(c));
    auto late = loop.timer().afterDelay(limit).then([self, limit]() {
      throwError(ErrorCode::DEADLINE_EXCEEDED,
                 kj::str("the resolver at ", self->url.c_str(), " did not answer within ",
                         limit / kj::MILLISECONDS, " ms"));
    });
    return asked.exclusiveJoin(kj::mv(late)).attach(kj::mv(self));
  });
  done->wait(true);
  KJ_IF_MAYBE(e, done->error()) {
    raise(*e);
  }
  return done;
}

}  // namespace

py::list PyResolver::list(const std::string& prefix, double timeout) {
  auto done = askResolver<EndpointsCompletion>(
      shared_from_this(), timeout, [prefix](Resolver& resolver, EndpointsCompletion& out) {
        return resolver.resolve(prefix).then([&out](kj::Array<Endpoint> found) {
          std::sort(found.begin(), found.end(),
                    [](const Endpoint& a, const Endpoint& b) { return a.name < b.name; });
          out.endpoints = kj::mv(found);
        });
      });
  return endpointList(done->endpoints, false);
}

py::list PyResolver::jobs(double timeout) {
  auto done = askResolver<JobsCompletion>(
      shared_from_this(), timeout, [](Resolver& resolver, JobsCompletion& out) {
        return resolver.jobs().then([&out](kj::Array<JobInfo> found) {
          std::sort(found.begin(), found.end(), [](const JobInfo& a, const JobInfo& b) {
            return a.status.jobId < b.status.jobId;
          });
          out.jobs = kj::mv(found);
        });
      });
  return jobList(done->jobs);
}

kj::Own<Completion> PyGroup::startWaitReady(size_t count, double timeout) {
  auto limit = durationOf(timeout, "timeout");
  auto done = kj::atomicRefcounted<EndpointsCompletion>();
  python::start(*done, [self = shared_from_this(), count, limit](EventLoop&, Completion& c) {
    auto& out = static_cast<EndpointsCompletion&>(c);
    return self->group.get()
        .waitReady(count, limit)
        .then([&out](kj::Array<Endpoint> ready) { out.endpoints = kj::mv(ready); })
        .attach(kj::mv(self));
  });
  return done;
}

py::list PyGroup::readyNames(Completion& done) {
  KJ_IF_MAYBE(e, done.error()) {
    raise(*e);
  }
  return endpointList(static_cast<EndpointsCompletion&>(done).endpoints, true);
}

py::list PyGroup::waitReady(size_t count, double timeout) {
  auto done = startWaitReady(count, timeout);
  done->wait(true);
  return readyNames(*done);
}

py::list PyGroup::members() {
  auto done = kj::atomicRefcounted<EndpointsCompletion>();
  runOn<EndpointsCompletion>(done, [this](EventLoop&, EndpointsCompletion& c) {
    c.endpoints = group.get().members();
    return kj::READY_NOW;
  });
  return endpointList(done->endpoints, false);
}

// ---------------------------------------------------------------------------------------------
// Methods, and calls

namespace {

struct SchemaCompletion final : public Completion {
  kj::Maybe<capnp::InterfaceSchema> schema;
};

}  // namespace

bool Methods::known() {
  std::lock_guard<std::mutex> lock(mutex);
  return schema.has_value();
}

kj::Own<Completion> Methods::startFetch(kj::Function<Fetch()> fetch) {
  auto done = kj::atomicRefcounted<SchemaCompletion>();
  start(*done, [fetched = fetch(), loaded = loader](EventLoop&, Completion& c) mutable {
    auto& mine = static_cast<SchemaCompletion&>(c);
    return fetched(*loaded)
        .then([&mine](capnp::InterfaceSchema s) { mine.schema = s; })
        .attach(kj::mv(fetched), kj::mv(loaded));
  });
  return done;
}

void Methods::learn(Completion& fetched) {
  KJ_IF_MAYBE(e, fetched.error()) {
    raise(*e);
  }
  auto& done = static_cast<SchemaCompletion&>(fetched);
  std::lock_guard<std::mutex> lock(mutex);
  if (!schema) schema = KJ_ASSERT_NONNULL(done.schema);
}

capnp::InterfaceSchema Methods::interface(kj::Function<Fetch()>& fetch) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (schema) return *schema;
  }
  auto done = startFetch(kj::mv(fetch));
  done->wait(true);
  learn(*done);
  std::lock_guard<std::mutex> lock(mutex);
  return *schema;
}

MethodRef Methods::find(const std::string& name, kj::Function<Fetch()>& fetch) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = found.find(name);
    if (it != found.end()) return it->second;
  }
  std::string method = name;
  auto dot = name.rfind('.');
  if (dot != std::string::npos) {
    method = name.substr(dot + 1);
    if (name.substr(0, dot) != actor) {
      raiseInvalidArgument("'" + name + "': this calls actor '" + actor + "' (name its methods '" +
                           actor + ".METHOD' or 'METHOD')");
    }
  }
  auto s = interface(fetch);
  kj::Maybe<capnp::InterfaceSchema::Method> lookedUp;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { lookedUp = troupe::findMethod(s, method); })) {
    raise(*e);
  }
  auto m = KJ_ASSERT_NONNULL(lookedUp);
  MethodRef ref{s, m, actor + "." + describeMethod(m)};
  std::lock_guard<std::mutex> lock(mutex);
  found.emplace(name, ref);
  return ref;
}

std::shared_ptr<PreparedCall> Methods::prepare(const std::string& method, py::handle params,
                                               py::dict fields, bool idempotent,
                                               std::optional<double> timeout,
                                               kj::Function<Fetch()> fetch) {
  auto call = std::make_shared<PreparedCall>(find(method, fetch));
  auto root = call->params.initRoot<capnp::DynamicStruct>(call->method.method.getParamType());
  if (!params.is_none() && PyDict_Check(params.ptr()) && fields.size() > 0) {
    for (auto item : fields) {
      if (PyDict_Contains(params.ptr(), item.first.ptr()) == 1) {
        raiseInvalidArgument(call->method.signature + ": '" + item.first.cast<std::string>() +
                             "' given both in the parameters' dict and as a keyword");
      }
    }
  }
  try {
    fillStruct(root, params, call->method.signature, &call->borrowed);
    fillStruct(root, fields, call->method.signature, &call->borrowed);
  } catch (const kj::Exception& e) {
    // A value too large for any message (a Data of 512 MiB or more) is refused as the
    // connection refuses a message over its limit: nothing was sent. The module's connections
    // keep the default limit.
    KJ_IF_MAYBE(tooLarge, tooLargeToBuild(e, DEFAULT_MAX_MESSAGE_BYTES)) {
      raise(*tooLarge);
    }
    throw;
  }
  call->options.idempotent = idempotent;
  if (timeout) call->options.deadline = durationOf(*timeout, "timeout");
  return call;
}

kj::Own<CallCompletion> startCall(std::shared_ptr<PreparedCall> prepared, Send send) {
  auto completion = kj::atomicRefcounted<CallCompletion>();
  completion->resultType = prepared->method.method.getResultType();
  completion->views = prepared->views;
  python::start(*completion,
                [prepared = kj::mv(prepared),
                 send = kj::mv(send)](EventLoop&, Completion& c) mutable -> kj::Promise<void> {
                  auto& done = static_cast<CallCompletion&>(c);
                  auto& call = *prepared;
                  return send(call)
                      .then([&done](CallResult<capnp::Response<capnp::DynamicStruct>>&& r) {
                        // A pool call's error concerns the member of its last attempt.
                        if (!r.endpoint.name.empty()) done.endpoint = kj::mv(r.endpoint.name);
                        done.results = copyOf(r.take(), done.kept);
                      })
                      .attach(kj::mv(prepared), kj::mv(send));
                });
  return completion;
}

py::object resultOf(CallCompletion& c) {
  KJ_IF_MAYBE(e, c.error()) {
    raise(*e, c.endpoint);
  }
  auto root = c.results->getRoot<capnp::DynamicStruct>(c.resultType);
  return toPython(root.asReader(), c.views);
}

// ---------------------------------------------------------------------------------------------
// PyPool

PyPool::PyPool(std::shared_ptr<PyGroup> g, ActorPoolOptions options)
    : group(kj::mv(g)), methods(group->actor) {
  auto done = kj::atomicRefcounted<Completion>();
  runOn<Completion>(done, [this, options](EventLoop&, Completion&) mutable {
    pool.set(kj::heap<ActorPoolBase>(group->group.get(), kj::mv(options)));
    return kj::READY_NOW;
  });
}

namespace {

// The interface of a READY member of `pool`'s group (the same for every member), once one is.
// Waits up to `limit` for one (the call's timeout, else the pool's default deadline).
kj::Promise<capnp::InterfaceSchema> schemaOfAMember(std::shared_ptr<PyPool> pool,
                                                    capnp::SchemaLoader& loader,
                                                    kj::Duration limit) {
  auto& group = pool->group->group.get();
  return group.waitReady(1, limit).then(
      [&group, &loader, pool,
       limit](kj::Array<Endpoint>) mutable -> kj::Promise<capnp::InterfaceSchema> {
        auto ready = group.readyMembers();
        // It left again before this turn: wait for one anew.
        if (ready.size() == 0) return schemaOfAMember(kj::mv(pool), loader, limit);
        auto member = kj::mv(ready[0]);
        return openDynamicActor(member->ref.channel(), pool->group->actor.c_str(), loader)
            .then([](DynamicActor actor) { return actor.schema; })
            .attach(kj::mv(member));
      });
}

}  // namespace

kj::Function<Methods::Fetch()> PyPool::fetchFromAMember(std::optional<double> timeout) {
  kj::Maybe<kj::Duration> limit;
  if (timeout) limit = durationOf(*timeout, "timeout");
  return [self = shared_from_this(), limit]() -> Methods::Fetch {
    return [self, limit](capnp::SchemaLoader& loader) {
      // On the loop: the pool's options may be read here.
      auto wait = limit.orDefault(self->pool.get().options().defaultDeadline);
      return schemaOfAMember(self, loader, wait);
    };
  };
}

kj::Own<CallCompletion> PyPool::start(const std::string& method, py::handle params, py::dict fields,
                                      bool idempotent, std::optional<double> timeout, bool views) {
  auto prepared = methods.prepare(method, params, fields, idempotent, timeout,
                                  fetchFromAMember(timeout));
  prepared->views = views;
  return startCall(kj::mv(prepared), [self = shared_from_this()](PreparedCall& call) {
    return self->pool.get().callCapabilityResult(
        [&call](capnp::Capability::Client cap) { return send(call, cap); }, call.options);
  });
}

py::object PyPool::call(const std::string& method, py::handle params, py::dict fields,
                        bool idempotent, std::optional<double> timeout, bool views) {
  auto completion = start(method, params, fields, idempotent, timeout, views);
  completion->wait();
  return resultOf(*completion);
}

std::shared_ptr<PyBroadcast> PyPool::broadcast(const std::string& method, py::handle params,
                                               py::dict fields, std::optional<double> timeout,
                                               bool views) {
  auto prepared = methods.prepare(method, params, fields, false, timeout,
                                  fetchFromAMember(timeout));
  prepared->views = views;
  return std::make_shared<PyBroadcast>(shared_from_this(), kj::mv(prepared));
}

// ---------------------------------------------------------------------------------------------
// PyRef

PyRef::PyRef(const std::string& address, const std::string& actor)
    : address(address), methods(actor) {
  auto done = kj::atomicRefcounted<Completion>();
  runOn<Completion>(done, [this](EventLoop& loop, Completion&) {
    ref.set(
        kj::heap<ActorRefBase>(Channel::open(loop, this->address.c_str()), methods.actor.c_str()));
    return kj::READY_NOW;
  });
}

kj::Function<Methods::Fetch()> PyRef::fetchFromIt() {
  return [self = shared_from_this()]() -> Methods::Fetch {
    return [self](capnp::SchemaLoader& loader) {
      return openDynamicActor(self->ref.get().channel(), self->methods.actor.c_str(), loader)
          .then([](DynamicActor actor) { return actor.schema; });
    };
  };
}

kj::Own<CallCompletion> PyRef::start(const std::string& method, py::handle params, py::dict fields,
                                     bool idempotent, std::optional<double> timeout, bool views) {
  auto prepared = methods.prepare(method, params, fields, idempotent, timeout, fetchFromIt());
  prepared->views = views;
  auto completion = startCall(kj::mv(prepared), [self = shared_from_this()](PreparedCall& call) {
    using Response = capnp::Response<capnp::DynamicStruct>;
    auto& ref = self->ref.get();
    // A call not marked idempotent is sent so that it runs once while the actor's server lives
    // (ActorRefBase::sendOnce); `call` is kept until the call ends (startCall).
    auto sent = ref.sendsOnce(call.options)
                    ? ref.sendOnce<Response>(
                          [&call](capnp::Capability::Client cap) -> kj::Promise<Response> {
                            return send(call, kj::mv(cap));
                          })
                    : kj::evalNow(
                          [&]() -> kj::Promise<Response> { return send(call, ref.capability()); });
    return ref.finishCall(kj::mv(sent), call.options)
        .then([](capnp::Response<capnp::DynamicStruct>&& r) {
          CallResult<capnp::Response<capnp::DynamicStruct>> result;
          result.value = kj::mv(r);
          return result;
        });
  });
  completion->endpoint = address;
  return completion;
}

py::object PyRef::call(const std::string& method, py::handle params, py::dict fields,
                       bool idempotent, std::optional<double> timeout, bool views) {
  auto completion = start(method, params, fields, idempotent, timeout, views);
  completion->wait();
  return resultOf(*completion);
}

// ---------------------------------------------------------------------------------------------
// PyBroadcast

PyBroadcast::PyBroadcast(std::shared_ptr<PyPool> p, std::shared_ptr<PreparedCall> prepared)
    : pool(kj::mv(p)), call(kj::mv(prepared)) {
  // The prepared call is shared by every member's request and kept by the broadcast.
  auto done = kj::atomicRefcounted<Completion>();
  runOn<Completion>(done, [this](EventLoop&, Completion&) {
    auto shared = call;
    auto options = shared->options;
    future.set(kj::heap(pool->pool.get().broadcastCapability(
        [shared](capnp::Capability::Client cap) { return send(*shared, cap); }, options)));
    return kj::READY_NOW;
  });
}

namespace {

using DynamicResult = CallResult<capnp::Response<capnp::DynamicStruct>>;

BroadcastCompletion::Member memberOf(DynamicResult& r) {
  BroadcastCompletion::Member m;
  m.endpoint = r.endpoint.name;
  m.error = kj::mv(r.error);
  KJ_IF_MAYBE(v, r.value) {
    m.results = copyOf(*v, m.kept);
  }
  return m;
}

}  // namespace

kj::Own<BroadcastCompletion> PyBroadcast::start(Wait how, size_t k, double timeout) {
  auto limit = durationOf(timeout, "timeout");
  if (how == Wait::QUORUM && k == 0) raiseInvalidArgument("wait_quorum() needs k of at least 1");
  // The results move out of the broadcast when collected: once only.
  if (collected) raiseInvalidArgument("this broadcast was waited for already");
  collected = true;
  auto done = kj::atomicRefcounted<BroadcastCompletion>();
  python::start(*done,
                [self = shared_from_this(), how, k, limit](EventLoop& loop, Completion& c) mutable {
                  auto& out = static_cast<BroadcastCompletion&>(c).members;
                  auto future = kj::mv(self->future.get());
                  auto keep = [&out](kj::Array<DynamicResult> all) {
                    for (auto& r : all) out.push_back(memberOf(r));
                  };
                  kj::Promise<void> waited = nullptr;
                  if (how == Wait::ALL) {
                    waited = kj::mv(future).waitAll(limit).then(kj::mv(keep));
                  } else if (how == Wait::QUORUM) {
                    waited = kj::mv(future).waitQuorum(k, limit).then(kj::mv(keep));
                  } else {
                    waited = kj::mv(future)
                                 .waitAny()
                                 .then([&out](DynamicResult r) { out.push_back(memberOf(r)); })
                                 .exclusiveJoin(loop.timer().afterDelay(limit).then([limit]() {
                                   throwError(ErrorCode::DEADLINE_EXCEEDED,
                                              kj::str("no member succeeded within ", limit));
                                 }));
                  }
                  return waited.attach(kj::mv(self));
                });
  return done;
}

py::list PyBroadcast::results(BroadcastCompletion& done) {
  KJ_IF_MAYBE(e, done.error()) {
    raise(*e);
  }
  py::list out;
  auto resultType = call->method.method.getResultType();
  for (auto& m : done.members) {
    KJ_IF_MAYBE(e, m.error) {
      out.append(py::make_tuple(m.endpoint, py::none(), errorObject(*e, m.endpoint)));
    } else {
      auto root = m.results->getRoot<capnp::DynamicStruct>(resultType);
      out.append(py::make_tuple(m.endpoint, toPython(root.asReader(), call->views), py::none()));
    }
  }
  return out;
}

py::list PyBroadcast::wait(Wait how, size_t k, double timeout) {
  auto done = start(how, k, timeout);
  done->wait(true);
  return results(*done);
}

namespace {

struct BlobCompletion final : public Completion {
  kj::Array<BlobResult> results;
};

Fanout fanoutOf(const std::string& name) {
  if (name == "star") return Fanout::STAR;
  if (name == "chain") return Fanout::CHAIN;
  if (name == "tree") return Fanout::TREE;
  raiseInvalidArgument("fanout must be 'star', 'chain' or 'tree', not '" + name + "'");
}

}  // namespace

py::list PyPool::broadcastBlob(const std::string& name, uint64_t version, py::handle data,
                               const std::string& fanout, uint32_t treeFanout,
                               std::optional<uint32_t> chunkBytes,
                               std::optional<uint64_t> windowBytes, double timeout,
                               bool sameHostReads) {
  BlobSendOptions options;
  options.sameHostReads = sameHostReads;
  options.channel.credentials = group->resolver->credentials;  // open_resolver()'s, if given
  options.fanout = fanoutOf(fanout);
  options.treeFanout = treeFanout;
  if (chunkBytes) options.chunkBytes = *chunkBytes;
  if (windowBytes) options.windowBytes = *windowBytes;
  auto limit = durationOf(timeout, "timeout");
  kj::Array<const kj::byte> bytes;
  int device = -1;  // the CUDA device the bytes are on, if any
  KJ_IF_MAYBE(d, deviceBytesOf(data, "the blob")) {
    bytes = kj::mv(d->bytes);
    device = d->device;
  } else {
    bytes = borrowBuffer(data, "the blob");
  }
  auto done = kj::atomicRefcounted<BlobCompletion>();
  runOn<BlobCompletion>(
      done,
      [self = shared_from_this(), name, version, limit, bytes = kj::mv(bytes), device,
       options = kj::mv(options)](EventLoop& loop, BlobCompletion& c) mutable {
        if (device >= 0) options.device = cudaBlobDevice(loop, device);
        auto transfer = kj::heap(
            self->pool.get().broadcastBlob(name.c_str(), version, kj::mv(bytes), kj::mv(options)));
        auto& t = *transfer;
        return t.waitAll(limit)
            .then([&c](kj::Array<BlobResult> results) { c.results = kj::mv(results); })
            .attach(kj::mv(transfer), kj::mv(self));
      },
      true);
  py::list out;
  for (auto& r : done->results) {
    py::object error = py::none();
    KJ_IF_MAYBE(e, r.error) {
      error = errorObject(*e, r.endpoint);
    }
    out.append(py::make_tuple(r.endpoint, error, r.bytes, double(r.latency / kj::NANOSECONDS) / 1e9,
                              r.pulledBytes));
  }
  return out;
}

}  // namespace troupe::python
