#pragma once
// What Python holds of troupe's client side: a resolver, groups over it, pools over a group and
// broadcasts of a pool. Each wraps objects that live on the module's loop (runtime.h); Python
// threads only post work to them. A pool keeps its group, and a group its resolver, alive.
//
// These are held by std::shared_ptr: by Python (pybind11's holder), by what is built on them
// (a pool holds its group), and by work in flight on the loop, so that an object Python drops,
// or a wait Ctrl-C interrupts, never leaves the loop with a dangling reference. The last owner
// may be the loop thread; nothing here touches Python objects when it goes.

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <capnp/schema-loader.h>
#include <pybind11/pybind11.h>

#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/resolver.h"
#include "python/src/runtime.h"
#include "python/src/values.h"

namespace troupe::python {

// A loop object held from Python: made on the loop thread, dropped there when the holder goes
// (or when the loop stops, if the holder outlives it).
template <typename T>
class LoopOwned {
public:
  LoopOwned() = default;
  ~LoopOwned() {
    if (id != 0) dropHeld(id);
  }
  KJ_DISALLOW_COPY(LoopOwned);
  // Loop thread, once.
  void set(kj::Own<T> o) {
    ptr = o.get();
    id = keepHeld(kj::heap<Held>(kj::mv(o)));
  }
  T& get() { return *ptr; }  // loop thread only

private:
  struct Held final : public LoopHeld {
    explicit Held(kj::Own<T> o) : object(kj::mv(o)) {}
    kj::Own<T> object;
  };
  T* ptr = nullptr;
  uint64_t id = 0;
};

// Credentials given to open_resolver() as arguments: files, "" for none. All empty: the
// environment's (the loop's credentials).
struct ClientCredentialFiles {
  std::string tokenFile;
  std::string tlsCa;
  std::string tlsCert;
  std::string tlsKey;
  std::string tlsServerName;
};

class PyResolver : public std::enable_shared_from_this<PyResolver> {
public:
  // Raises InvalidArgument for a bad URL or a credential file that is missing or unfit.
  PyResolver(const std::string& url, const ClientCredentialFiles& files);
  // Every endpoint whose name starts with `prefix`, in name order: dicts of name, address,
  // state, incarnation. Waits up to `timeout` seconds for the resolver (interruptible).
  pybind11::list list(const std::string& prefix, double timeout);
  // Every job the resolver knows, open or ended, in name order: dicts of name, state ("running",
  // "succeeded", "failed", "stopped", "unschedulable" or "ended"), reason, launcher, replicas,
  // ready, endpoints, created_at and ended_at (Unix seconds, None when unknown or running).
  pybind11::list jobs(double timeout);
  LoopOwned<Resolver> resolver;
  std::string url;
  // What the resolver and its groups' connections to members present and verify with; null for
  // the loop's.
  std::shared_ptr<Credentials> credentials;
};

class PyGroup : public std::enable_shared_from_this<PyGroup> {
public:
  PyGroup(std::shared_ptr<PyResolver> resolver, const std::string& job, const std::string& actor);

  // The READY members' names once `count` are; raises JobEnded, DeadlineExceeded.
  pybind11::list waitReady(size_t count, double timeout);
  // waitReady() for asyncio: starts the wait; readyNames() gives what it found once done (GIL
  // held), raising what it failed with.
  kj::Own<Completion> startWaitReady(size_t count, double timeout);
  static pybind11::list readyNames(Completion& done);
  // Every member the resolver lists: dicts of name, address, state, incarnation.
  pybind11::list members();

  std::shared_ptr<PyResolver> resolver;
  LoopOwned<ActorGroupBase> group;
  std::string job;
  std::string actor;
};

// One call's result as it crosses to Python: its response copied into a message of its own.
class CallCompletion final : public Completion {
public:
  KeptReceived kept;  // the response's large Data, which `results` refers to
  kj::Own<capnp::MallocMessageBuilder> results;
  bool views = false;  // large Data reach Python as views (toPython())
  capnp::StructSchema resultType;
  // What its errors name as their endpoint: the address of a Ref's call; for a pool's call,
  // the member its last attempt went to (empty, so None, if no member was ever tried).
  std::string endpoint;
};

// The interface of a pool's members and one method of it, found by name.
struct MethodRef {
  capnp::InterfaceSchema schema;
  capnp::InterfaceSchema::Method method;
  std::string signature;  // "calc.add (a :Float64, b :Float64) -> (value :Float64)"
};

// A call ready to go: parameters built from Python, copied into each attempt's request.
struct PreparedCall {
  explicit PreparedCall(MethodRef method) : method(kj::mv(method)) {}
  MethodRef method;
  Borrowed borrowed;                       // the buffers `params` refers to: it goes first
  capnp::MallocMessageBuilder params{64};  // small calls need no more; large ones grow
  CallOptions options;
  bool views = false;  // the results' large Data reach Python as views (toPython())
};

// The interface of one actor (a pool's members', or one ActorRef's) and its methods by name,
// for calls from Python. The schema is fetched on first use. Thread-safe.
class Methods {
public:
  // Loop thread: fetches the interface into the loader; must own what it uses.
  using Fetch = kj::Function<kj::Promise<capnp::InterfaceSchema>(capnp::SchemaLoader&)>;

  explicit Methods(std::string actor) : actor(kj::mv(actor)) {}

  // Python thread, GIL held: `method` ("add" or "<actor>.add") with `params` (a dict or None)
  // and keyword `fields`, checked and built; raises InvalidArgument before anything is sent.
  // `fetch` is called (on the loop) only while the interface is not known yet.
  std::shared_ptr<PreparedCall> prepare(const std::string& method, pybind11::handle params,
                                        pybind11::dict fields, bool idempotent,
                                        std::optional<double> timeout, kj::Function<Fetch()> fetch);

  // Whether the interface is known (prepare() then never waits). Any thread.
  bool known();
  // Starts fetching the interface through `fetch`, for asyncio (which must not wait for it in
  // prepare()); learn() takes what it fetched.
  kj::Own<Completion> startFetch(kj::Function<Fetch()> fetch);
  // Python thread, GIL held: the interface `fetched` (from startFetch()) found, or its error
  // raised.
  void learn(Completion& fetched);

  const std::string actor;

private:
  capnp::InterfaceSchema interface(kj::Function<Fetch()>& fetch);
  MethodRef find(const std::string& method, kj::Function<Fetch()>& fetch);

  std::mutex mutex;
  std::shared_ptr<capnp::SchemaLoader> loader = std::make_shared<capnp::SchemaLoader>();
  std::optional<capnp::InterfaceSchema> schema;
  std::map<std::string, MethodRef, std::less<>> found;  // by the name Python used
};

// Starts `call` on the loop through `send` (which must own what it uses) and returns its
// completion; its results are copied out for Python, and its error names the result's endpoint
// when there is one (a pool call's member).
using Send =
    kj::Function<kj::Promise<CallResult<capnp::Response<capnp::DynamicStruct>>>(PreparedCall&)>;
kj::Own<CallCompletion> startCall(std::shared_ptr<PreparedCall> call, Send send);

// The result of a finished call as a dict, or its error raised. GIL held.
pybind11::object resultOf(CallCompletion& c);

class PyPool;

// What a broadcast's wait collected: per member, its endpoint and results or error.
struct BroadcastCompletion final : public Completion {
  struct Member {
    std::string endpoint;
    KeptReceived kept;  // as CallCompletion's
    kj::Own<capnp::MallocMessageBuilder> results;
    kj::Maybe<kj::Exception> error;
  };
  std::vector<Member> members;
};

class PyBroadcast : public std::enable_shared_from_this<PyBroadcast> {
public:
  PyBroadcast(std::shared_ptr<PyPool> pool, std::shared_ptr<PreparedCall> call);

  // How the results are waited for (BroadcastFuture's waits): every member's, within the
  // timeout; the first success; the first `k` successes, within the timeout.
  enum class Wait { ALL, ANY, QUORUM };
  // Starts the wait; once per broadcast (a second raises InvalidArgument). GIL held.
  kj::Own<BroadcastCompletion> start(Wait how, size_t k, double timeout);
  // What a finished wait collected: (endpoint, value dict or None, error or None) per member, in
  // endpoint name order for ALL, in completion order otherwise; raises what ANY or QUORUM
  // failed with (every member failed, too few can succeed, the timeout). GIL held.
  pybind11::list results(BroadcastCompletion& done);
  // start() and results(), waiting in between (interruptible).
  pybind11::list wait(Wait how, size_t k, double timeout);

  std::shared_ptr<PyPool> pool;
  std::shared_ptr<PreparedCall> call;
  LoopOwned<BroadcastFuture<capnp::Response<capnp::DynamicStruct>>> future;
  bool collected = false;  // a wait was started (Python thread, GIL held)
};

class PyPool : public std::enable_shared_from_this<PyPool> {
public:
  PyPool(std::shared_ptr<PyGroup> group, ActorPoolOptions options);

  // A call of `method` (see Methods::prepare), started. With `views`, large Data in its results
  // reach Python as views (toPython()).
  kj::Own<CallCompletion> start(const std::string& method, pybind11::handle params,
                                pybind11::dict fields, bool idempotent,
                                std::optional<double> timeout, bool views);
  pybind11::object call(const std::string& method, pybind11::handle params, pybind11::dict fields,
                        bool idempotent, std::optional<double> timeout, bool views);
  std::shared_ptr<PyBroadcast> broadcast(const std::string& method, pybind11::handle params,
                                         pybind11::dict fields, std::optional<double> timeout,
                                         bool views);

  // Sends `data` (any buffer, not copied) as blob `name` at `version` to every READY member
  // (ActorPool::broadcastBlob) and waits, the GIL released, up to `timeout` seconds: one tuple
  // (endpoint, error or None, bytes, seconds) per member, in name order.
  pybind11::list broadcastBlob(const std::string& name, uint64_t version, pybind11::handle data,
                               const std::string& fanout, uint32_t treeFanout,
                               std::optional<uint32_t> chunkBytes,
                               std::optional<uint64_t> windowBytes, double timeout,
                               bool sameHostReads = true);

  std::shared_ptr<PyGroup> group;
  LoopOwned<ActorPoolBase> pool;
  // The interface of the members; asyncio fetches it (Methods::startFetch) before a first call.
  Methods methods;
  // Fetches the interface from a READY member, waiting up to `timeout` seconds for one (the
  // call's; default: the pool's deadline).
  kj::Function<Methods::Fetch()> fetchFromAMember(std::optional<double> timeout = std::nullopt);
};

// One actor at one address (ActorRef): calls straight to it, never retried.
class PyRef : public std::enable_shared_from_this<PyRef> {
public:
  PyRef(const std::string& address, const std::string& actor);

  kj::Own<CallCompletion> start(const std::string& method, pybind11::handle params,
                                pybind11::dict fields, bool idempotent,
                                std::optional<double> timeout, bool views);
  pybind11::object call(const std::string& method, pybind11::handle params, pybind11::dict fields,
                        bool idempotent, std::optional<double> timeout, bool views);

  const std::string address;
  LoopOwned<ActorRefBase> ref;
  Methods methods;  // as PyPool's
  kj::Function<Methods::Fetch()> fetchFromIt();
};

// Seconds (Python) to a kj::Duration, at most a century; raises InvalidArgument for a negative
// or NaN value.
kj::Duration durationOf(double seconds, const char* what);

}  // namespace troupe::python
