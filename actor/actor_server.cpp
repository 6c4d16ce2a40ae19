#include "troupe/actor/actor_server.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <vector>

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/detail/actor_gate.h"
#include "troupe/actor/detail/blob_receiver.h"
#include "troupe/actor/detail/schema_nodes.h"
#include "troupe/base/errors.h"
#include "troupe/net/address.h"
#include "troupe/net/rpc_acceptor.h"
#include "troupe/net/same_host.h"

namespace troupe {

namespace {

// The loop's calendar time in nanoseconds, and in any case more than any incarnation handed
// out before in this process: two servers made in the same instant (or on a manual clock
// that did not move) still differ, and a newer one still replaces an older one's entries.
uint64_t freshIncarnation(EventLoop& loop) {
  // The one process-wide value here: incarnations must be unique across every loop.
  static std::atomic<uint64_t> last{0};
  auto now = static_cast<uint64_t>((loop.calendarNow() - kj::UNIX_EPOCH) / kj::NANOSECONDS);
  uint64_t previous = last.load();
  uint64_t next;
  do {
    next = now > previous ? now : previous + 1;
  } while (!last.compare_exchange_weak(previous, next));
  return next;
}

bool isWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

std::string machineName() {
  char name[256];
  if (gethostname(name, sizeof(name)) != 0) return "localhost";
  name[sizeof(name) - 1] = '\0';
  return name;
}

// How long, past the grace period, replies already produced may take to reach the wire.
constexpr kj::Duration FLUSH_ALLOWANCE = 1 * kj::SECONDS;

}  // namespace

// ------------------------------------------------------------------------------------------------

// The ActorHost a connection is served; `peer`: its client's process id, where it is a process
// of this user on this host (RpcAcceptor::bootstrapPerConnection()).
capnp::Capability::Client newActorHost(ActorServer::Impl& server,
                                       std::shared_ptr<const LocalPeer> peer);

struct ActorServer::Impl final : public MetricsSource, public kj::HttpService {
  Impl(EventLoop& loop, JobContext job, ActorServerOptions options)
      : loop(loop),
        job(kj::mv(job)),
        options(kj::mv(options)),
        log(this->options.logger ? this->options.logger : loop.logger()),
        incarnation(this->options.incarnation != 0 ? this->options.incarnation
                                                   : freshIncarnation(loop)),
        acceptor(kj::heap<RpcAcceptor>(loop, newActorHost(*this, nullptr),
                                       this->options.maxMessageBytes, log, "actor server",
                                       this->options.credentials, this->options.connections)) {
    acceptor->bootstrapPerConnection([this](std::shared_ptr<const LocalPeer> peer) {
      return newActorHost(*this, kj::mv(peer));
    });
    auto paf = kj::newPromiseAndFulfiller<void>();
    drainStarted = paf.promise.fork();
    drainStartedFulfiller = kj::mv(paf.fulfiller);
    metricsRegistration = loop.metrics().add(*this);
    ChannelOptions forwarding;
    forwarding.maxMessageBytes = this->options.maxMessageBytes;
    forwarding.credentials = this->options.credentials;
    blobs = kj::heap<actor_detail::BlobReceiver>(loop, kj::mv(forwarding), log,
                                                 [this]() { return kj::str(who()); });
    acceptor->placeSegmentsWith(*blobs);
  }

  ~Impl() noexcept(false) {
    http = nullptr;
    // Connections first: they hold the gates, which refer to the actors and the tracker. Then
    // the calls they leave behind, which Cap'n Proto would only cancel on a later turn.
    acceptor = nullptr;
    tracker.abortAll(makeError(ErrorCode::DISCONNECTED, "the actor server was destroyed"));
    replies.clear();
  }

  // --- actors

  actor_detail::HostedActor& find(kj::StringPtr name) {
    for (auto& a : actors) {
      if (a->name == name.cStr()) return *a;
    }
    kj::Vector<kj::StringPtr> names;
    for (auto& a : actors) names.add(kj::StringPtr(a->name));
    throwError(ErrorCode::ACTOR_NOT_FOUND,
               kj::str("no actor named '", name, "' at ", endpointAddress(), " (hosted: ",
                       names.empty() ? kj::str("none") : kj::strArray(names, ", "), ")"));
  }

  void fillInfo(const actor_detail::HostedActor& actor, schema::ActorInfo::Builder info) {
    info.setName(actor.name);
    info.setInterfaceName(actor.schema.getProto().getDisplayName());
    info.setInterfaceId(actor.schema.getProto().getId());
    kj::Vector<kj::StringPtr> methods;
    std::set<uint64_t> seen;
    collectMethods(actor.schema, methods, seen);
    auto list = info.initMethods(methods.size());
    for (uint i = 0; i < methods.size(); ++i) list.set(i, methods[i]);
  }

  static void collectMethods(capnp::InterfaceSchema schema, kj::Vector<kj::StringPtr>& out,
                             std::set<uint64_t>& seen) {
    if (!seen.insert(schema.getProto().getId()).second) return;
    for (auto method : schema.getMethods()) out.add(method.getProto().getName());
    for (auto super : schema.getSuperclasses()) collectMethods(super, out, seen);
  }

  // "job 'ps' task 3 (ps, grad)": what the server's log lines are about.
  std::string who() const {
    std::string names;
    for (auto& a : actors) names += (names.empty() ? "" : ", ") + a->name;
    return "job '" + job.jobId + "' task " + std::to_string(job.taskIndex) + " (" +
           (names.empty() ? std::string("no actors") : names) + ")";
  }

  // --- endpoints

  EndpointState endpointState() const {
    return state == ServerState::DRAINING  ? EndpointState::DRAINING
           : state == ServerState::SERVING ? EndpointState::READY
                                           : EndpointState::STARTING;
  }

  std::string advertisedHost(const std::string& host) const {
    if (!isWildcardHost(host)) return host;
    return job.advertiseHost.empty() ? machineName() : job.advertiseHost;
  }

  std::string endpointAddress() const {
    if (!options.advertiseAddress.empty()) return options.advertiseAddress;
    auto bound = acceptor->bound();
    if (bound.size() == 0) return "";
    Address a = bound[0];
    if (a.isInet()) a.host = advertisedHost(a.host);
    return a.toString();
  }

  // --- HTTP

  void startHttp() {
    auto address = options.httpAddress.empty() ? job.metricsAddress : options.httpAddress;
    if (address.empty()) return;
    auto httpOptions = options.http;
    if (!httpOptions.credentials) {
      httpOptions.credentials = options.credentials ? options.credentials : loopCredentials(loop);
    }
    if (!httpOptions.logger) httpOptions.logger = log;
    http = kj::heap<HttpEndpoint>(loop, address, kj::mv(httpOptions), *this);
    // The published URL names a host others can reach, as the endpoint's address does.
    // Address does the host's brackets both ways.
    auto url = http->url();
    auto scheme = url.substr(0, url.find("://") + 3);
    auto bound = Address::parse(url.substr(scheme.size()));
    bound.host = advertisedHost(bound.host);
    httpUrl = scheme + bound.toString().substr(strlen("tcp://"));
    log->info("{}: serving HTTP on {} (/metrics, /healthz, /actors)", who(), http->url());
  }

  kj::Promise<void> request(kj::HttpMethod, kj::StringPtr url, const kj::HttpHeaders&,
                            kj::AsyncInputStream&, Response& response) override {
    auto& table = http->headerTable();
    auto path = url.slice(0, url.findFirst('?').orDefault(url.size()));
    if (path == "/healthz"_kj) {
      bool serving = state == ServerState::SERVING;
      return sendHttpText(response, table, serving ? 200 : 503, "text/plain; charset=utf-8",
                          kj::str(state == ServerState::SERVING    ? "ready\n"_kj
                                  : state == ServerState::DRAINING ? "draining\n"_kj
                                                                   : "stopped\n"_kj));
    }
    if (path == "/actors"_kj) {
      capnp::MallocMessageBuilder message;
      auto info = message.initRoot<schema::ServerInfo>();
      info.setJobId(job.jobId);
      info.setTaskIndex(job.taskIndex);
      info.setIncarnation(incarnation);
      info.setState(toCapnp(endpointState()));
      info.setAddress(endpointAddress());
      auto list = info.initActors(actors.size());
      for (uint i = 0; i < actors.size(); ++i) fillInfo(*actors[i], list[i]);
      capnp::JsonCodec json;
      json.setPrettyPrint(true);
      auto text = json.encode(info.asReader());
      return sendHttpText(response, table, 200, "application/json", kj::str(text, "\n"));
    }
    return sendHttpText(response, table, 404, "text/plain; charset=utf-8",
                        kj::str("not found: this server serves /metrics, /healthz and /actors\n"));
  }

  // --- metrics

  void collectMetrics(MetricsSnapshot& out) const override {
    for (auto& a : actors) a->collectMetrics(out, job.jobId);
    acceptor->collectMetrics(out, {{"job", job.jobId}, {"server", "actor"}});
    out.add("troupe_server_info",
            "One series per actor server: its job, task, incarnation and state (value 1).",
            MetricType::GAUGE,
            {{"job", job.jobId},
             {"task", std::to_string(job.taskIndex)},
             {"incarnation", std::to_string(incarnation)},
             {"state", toString(endpointState()).cStr()}},
            1);
    out.add("troupe_blob_sender_memory_read_bytes_total",
            "Bytes of blobs read straight from their senders' memory on this host "
            "(BlobSendOptions::sameHostReads).",
            MetricType::COUNTER, {{"job", job.jobId}}, double(blobs->bytesReadFromSenders()));
    collectReplyMetrics(out);
  }

  void collectReplyMetrics(MetricsSnapshot& out) const {
    auto& s = replies.stats();
    MetricLabels labels = {{"job", job.jobId}};
    out.add("troupe_server_reply_callers",
            "Callers whose calls the server remembers, so that their retries do not run twice.",
            MetricType::GAUGE, labels, double(s.callers));
    out.add("troupe_server_replies_running", "Calls sent to run once that are in progress.",
            MetricType::GAUGE, labels, double(s.running));
    out.add("troupe_server_replies_kept",
            "Replies kept for retries until their callers acknowledge them.", MetricType::GAUGE,
            labels, double(s.replies));
    out.add("troupe_server_reply_bytes", "Bytes held by kept replies and their bookkeeping.",
            MetricType::GAUGE, labels, double(s.bytes));
    out.add("troupe_server_replies_replayed_total",
            "Retried calls answered from a kept reply or a call in progress, not run again.",
            MetricType::COUNTER, labels, double(s.replayed));
    out.add("troupe_server_replies_forgotten_total",
            "Retried calls answered MAY_HAVE_RUN because their replies were no longer kept.",
            MetricType::COUNTER, labels, double(s.forgotten));
  }

  // Listens on this server's same-host socket, or logs why it cannot.
  void listenSameHost() {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { sameHostPath = bindSameHost(); })) {
      log->warn("{}: serving TCP alone, no same-host socket: {}", who(),
                e->getDescription().cStr());
      return;
    }
    log->info("{}: clients on this host reach it at unix:{}", who(), sameHostPath);
  }

  // Listens on a new socket in this user's directory of them, clearing out sockets left by
  // killed processes first, and returns its path.
  std::string bindSameHost() {
    auto dir = sameHostSocketDir();
    removeStaleSockets(dir);
    auto path = kj::str(dir, "/", sameHostSocketName(incarnation));
    acceptor->listen(kj::str("unix:", path));
    sameHostHost = sameHostId();
    return path.cStr();
  }

  Endpoint endpointOf(const actor_detail::HostedActor& actor) const {
    Endpoint e;
    e.name = job.endpointName(actor.name);
    e.address = endpointAddress();
    e.jobId = job.jobId;
    e.actor = actor.name;
    e.taskIndex = job.taskIndex;
    e.incarnation = incarnation;
    e.state = endpointState();
    if (!httpUrl.empty()) e.metadata["metrics"] = httpUrl;
    if (!sameHostPath.empty()) {
      e.metadata[SAME_HOST_SOCKET_KEY] = sameHostPath;
      e.metadata[SAME_HOST_ID_KEY] = sameHostHost;
    }
    return e;
  }

  void announceAll() {
    for (auto* l : endpointListeners) announceTo(*l);
  }

  void announceTo(EndpointListener& l) {
    for (auto& a : actors) l.endpointChanged(endpointOf(*a));
  }

  // --- serving

  void startDrain(kj::Duration grace) {
    if (drainDone != nullptr) return;
    drainStartedFulfiller->fulfill();
    if (state == ServerState::STOPPED) {
      drainDone = kj::Promise<void>(kj::READY_NOW).fork();
      return;
    }
    state = ServerState::DRAINING;
    tracker.draining = true;
    log->info("{}: draining {} (grace {} ms, {} calls in flight)", who(), endpointAddress(),
              grace / kj::MILLISECONDS, tracker.inFlight());
    announceAll();

    auto deadline = loop.timer().now() + grace;
    auto graceOver = loop.timer().atTime(deadline).then([this]() {
      log->warn("{}: grace period over with {} calls in flight; closing their connections", who(),
                tracker.inFlight());
    });
    // Calls first, within the grace period; then the replies already produced get a little
    // longer to reach the wire.
    drainDone = tracker.whenIdle()
                    .exclusiveJoin(kj::mv(graceOver))
                    .then([]() {
                      // Let the RPC system turn the last results into replies.
                      return kj::evalLast([]() {});
                    })
                    .then([this, deadline]() {
                      return acceptor->whenWritten().exclusiveJoin(
                          loop.timer().atTime(deadline + FLUSH_ALLOWANCE));
                    })
                    .then([this]() { stop(); })
                    .eagerlyEvaluate([this](kj::Exception&& e) {
                      log->error("drain failed: {}", e.getDescription().cStr());
                      stop();
                    })
                    .fork();
  }

  void stop() {
    if (state == ServerState::STOPPED) return;
    auto gone = kj::heapArrayBuilder<Endpoint>(actors.size());
    for (auto& a : actors) gone.add(endpointOf(*a));
    auto address = endpointAddress();
    acceptor->closeListeners();
    acceptor->closeConnections();
    tracker.abortAll(makeError(ErrorCode::DISCONNECTED,
                               "the server stopped before the call finished; it may have run"));
    replies.clear();
    blobs->stop();
    state = ServerState::STOPPED;
    http = nullptr;
    signals = nullptr;  // signals have their default effect again
    tracker.draining = true;
    for (auto* l : endpointListeners) {
      for (auto& e : gone) l->endpointRemoved(e);
    }
    log->info("{}: stopped {}", who(), address);
  }

  EventLoop& loop;
  JobContext job;
  ActorServerOptions options;
  std::shared_ptr<spdlog::logger> log;
  uint64_t incarnation;
  ServerState state = ServerState::STARTING;

  actor_detail::CallTracker tracker;
  kj::Vector<kj::Own<actor_detail::HostedActor>> actors;
  actor_detail::ReplyCache replies{loop.timer(), incarnation, options.replies};
  std::vector<EndpointListener*> endpointListeners;
  kj::Own<actor_detail::BlobReceiver> blobs;  // goes after the connections that write into it

  kj::Own<RpcAcceptor> acceptor;
  kj::Own<HttpEndpoint> http;  // once listening, when an HTTP address is set; null after stop
  std::string httpUrl;         // as published
  std::string sameHostPath;    // the same-host socket (ActorServerOptions::sameHost), once made
  std::string sameHostHost;    // sameHostId(), published beside it
  MetricsSet::Registration metricsRegistration;
  kj::ForkedPromise<void> drainStarted = nullptr;
  kj::Maybe<kj::Promise<void>> signals;  // while serve() runs
  kj::Own<kj::PromiseFulfiller<void>> drainStartedFulfiller;
  kj::Maybe<kj::ForkedPromise<void>> drainDone;
};

// ------------------------------------------------------------------------------------------------
// The bootstrap capability of every connection.

namespace {

class ActorHostImpl final : public schema::ActorHost::Server {
public:
  ActorHostImpl(ActorServer::Impl& server, std::shared_ptr<const LocalPeer> peer)
      : server(server), peer(kj::mv(peer)) {}

protected:
  kj::Promise<void> getActor(GetActorContext context) override {
    auto name = context.getParams().getName();
    // A caller whose connection broke may come back while the server drains, to collect what its
    // calls still running here answer: its lookup is answered, and the gate refuses its new calls.
    bool returning = context.getParams().hasCaller() && server.state == ServerState::DRAINING;
    if (server.tracker.draining && !returning) {
      throwError(ErrorCode::DRAINING,
                 kj::str("server at ", server.endpointAddress(), " is draining; actor '", name,
                         "' takes no new calls"));
    }
    auto& actor = server.find(name);
    if (context.getParams().hasCaller()) {
      auto caller = context.getParams().getCaller();
      server.replies.hello(caller.getCallerId(), caller.getFloor());
    }
    auto results = context.getResults();
    results.setActor(actor.client());
    server.fillInfo(actor, results.initInfo());
    results.setIncarnation(server.incarnation);
    return kj::READY_NOW;
  }

  kj::Promise<void> listActors(ListActorsContext context) override {
    auto results = context.getResults();
    auto list = results.initActors(server.actors.size());
    for (uint i = 0; i < server.actors.size(); ++i) server.fillInfo(*server.actors[i], list[i]);
    results.setIncarnation(server.incarnation);
    return kj::READY_NOW;
  }

  kj::Promise<void> getSchema(GetSchemaContext context) override {
    auto& actor = server.find(context.getParams().getName());
    auto nodes = actor_detail::schemaClosure(actor.schema);
    auto results = context.getResults();
    results.setInterfaceId(actor.schema.getProto().getId());
    auto list = results.initNodes(nodes.size());
    for (uint i = 0; i < nodes.size(); ++i) list.setWithCaveats(i, nodes[i].getProto());
    return kj::READY_NOW;
  }

  kj::Promise<void> receiveBlob(ReceiveBlobContext context) override {
    if (server.tracker.draining) {
      throwError(ErrorCode::DRAINING,
                 kj::str("server at ", server.endpointAddress(), " is draining; it takes no blob"));
    }
    return server.blobs->receive(context, peer);
  }

  kj::Promise<void> ping(PingContext context) override {
    auto results = context.getResults();
    results.setIncarnation(server.incarnation);
    results.setState(toCapnp(server.endpointState()));
    return kj::READY_NOW;
  }

  kj::Promise<void> drain(DrainContext context) override {
    auto params = context.getParams();
    auto& credentials = server.options.credentials ? *server.options.credentials
                                                   : *loopCredentials(server.loop);
    if (!credentials.jobTokenMatches(params.getJobCredential())) {
      bool none = !credentials.hasJobToken();
      server.log->warn("{}: refused a drain request: {}", server.who(),
                       none ? "this server has no job credential" : "a wrong job credential");
      return makeError(
          ErrorCode::PERMISSION_DENIED,
          none ? kj::str("this server of job '", server.job.jobId,
                         "' has no job credential, so it takes no drain request; stop it with "
                         "SIGTERM")
               : kj::str("draining a server of job '", server.job.jobId,
                         "' needs the job's credential, and ",
                         params.getJobCredential().size() == 0 ? "none was presented"
                                                               : "a wrong one was presented"));
    }
    auto millis = params.getGraceMillis();
    server.log->info("{}: drain requested by a peer", server.who());
    server.startDrain(millis == 0 ? server.options.drainGracePeriod : millis * kj::MILLISECONDS);
    return kj::READY_NOW;
  }

private:
  ActorServer::Impl& server;
  const std::shared_ptr<const LocalPeer> peer;  // the client, where a process of this user here
};

}  // namespace

capnp::Capability::Client newActorHost(ActorServer::Impl& server,
                                       std::shared_ptr<const LocalPeer> peer) {
  return kj::heap<ActorHostImpl>(server, kj::mv(peer));
}

// ------------------------------------------------------------------------------------------------

ActorServer::ActorServer(EventLoop& loop, JobContext job, ActorServerOptions options)
    : impl(kj::heap<Impl>(loop, kj::mv(job), kj::mv(options))) {
  validateJobId(impl->job.jobId);
  auto& http = impl->options.httpAddress.empty() ? impl->job.metricsAddress
                                                 : impl->options.httpAddress;
  if (!http.empty()) HttpEndpoint::checkAddress(http);
}

ActorServer::~ActorServer() noexcept(false) {}

void ActorServer::acceptBlobs(kj::StringPtr name, BlobAllocator allocate, BlobHandler handle,
                              BlobAcceptOptions options) {
  impl->blobs->accept(name, kj::mv(allocate), kj::mv(handle), kj::mv(options));
}

size_t ActorServer::blobTransferCount() const { return impl->blobs->transferCount(); }

void ActorServer::hostCapability(kj::StringPtr name, capnp::InterfaceSchema schema,
                                 capnp::Capability::Client actor, ActorOptions options) {
  validateActorName(name);
  KJ_REQUIRE(impl->state == ServerState::STARTING || impl->state == ServerState::SERVING,
             "cannot host an actor on a server that drains or has stopped", name);
  for (auto& a : impl->actors) {
    if (a->name == name.cStr()) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("an actor named '", name, "' is already hosted here"));
    }
  }
  impl->actors.add(kj::heap<actor_detail::HostedActor>(name, schema, kj::mv(actor), options,
                                                       impl->tracker, impl->replies,
                                                       impl->loop.timer(), impl->options.metrics));
  if (impl->state == ServerState::SERVING) {
    auto endpoint = impl->endpointOf(*impl->actors.back());
    for (auto* l : impl->endpointListeners) l->endpointChanged(endpoint);
  }
}

std::string ActorServer::listen(kj::StringPtr text) {
  KJ_REQUIRE(impl->state == ServerState::STARTING || impl->state == ServerState::SERVING,
             "cannot listen on a server that drains or has stopped");
  // The HTTP endpoint first, so that a taken HTTP port leaves nothing bound.
  if (impl->state == ServerState::STARTING && !impl->http) impl->startHttp();
  auto address = impl->acceptor->listen(text);
  auto bound = address.toString();
  impl->log->info("{}: listening on {} (incarnation {})", impl->who(), bound, impl->incarnation);
  if (impl->options.sameHost && impl->sameHostPath.empty() && address.kind == Address::Kind::TCP) {
    impl->listenSameHost();
  }
  if (impl->state == ServerState::STARTING) {
    impl->state = ServerState::SERVING;
    impl->announceAll();
  }
  return bound;
}

const Credentials& ActorServer::credentials() const {
  return impl->options.credentials ? *impl->options.credentials : *loopCredentials(impl->loop);
}

std::string ActorServer::defaultListenAddress() const {
  std::string scheme = credentials().canServeTls() ? "tls://" : "tcp://";
  return scheme + (impl->job.advertiseHost.empty() ? "127.0.0.1:0" : "0.0.0.0:0");
}

kj::Promise<void> ActorServer::serve() { return serve({SIGTERM, SIGINT}); }

kj::Promise<void> ActorServer::serve(std::initializer_list<int> signals) {
  if (impl->state == ServerState::STARTING) listen(defaultListenAddress());
  // The signals start a drain, and keep being caught until the server stops: one that arrives
  // while a drain asked for otherwise is under way (a launcher stopping the replica after
  // ActorGroup::drainMembers(), say) joins that drain instead of killing the process.
  if (signals.size() > 0) {
    impl->signals = impl->loop.onSignal(signals)
                        .then([this](int signum) {
                          impl->log->info("{}: received {}; draining", impl->who(),
                                          strsignal(signum));
                          impl->startDrain(impl->options.drainGracePeriod);
                        })
                        .eagerlyEvaluate(nullptr);
  }
  return impl->drainStarted.addBranch().then([this]() { return drain(); });
}

void ActorServer::serveUntilSignal() { serve().wait(impl->loop.waitScope()); }

kj::Promise<void> ActorServer::drain(kj::Maybe<kj::Duration> grace) {
  impl->startDrain(grace.orDefault(impl->options.drainGracePeriod));
  return KJ_ASSERT_NONNULL(impl->drainDone).addBranch();
}

ServerState ActorServer::state() const { return impl->state; }
uint64_t ActorServer::incarnation() const { return impl->incarnation; }
const JobContext& ActorServer::job() const { return impl->job; }
uint64_t ActorServer::callsInFlight() const { return impl->tracker.inFlight(); }

MetricsSnapshot ActorServer::metrics() const {
  MetricsSnapshot out;
  impl->collectMetrics(out);
  return out;
}

std::string ActorServer::httpUrl() const { return impl->http ? impl->httpUrl : std::string(); }

size_t ActorServer::connectionCount() const {
  return impl->acceptor.get() == nullptr ? 0 : impl->acceptor->connectionCount();
}

uint64_t ActorServer::incompleteMessageBytes() const {
  return impl->acceptor.get() == nullptr ? 0 : impl->acceptor->incompleteMessageBytes();
}

kj::Array<Endpoint> ActorServer::endpoints() const {
  if (impl->state == ServerState::STARTING || impl->state == ServerState::STOPPED) {
    return nullptr;
  }
  return KJ_MAP(a, impl->actors) { return impl->endpointOf(*a); };
}

kj::Array<std::string> ActorServer::listenAddresses() const {
  return KJ_MAP(a, impl->acceptor->bound()) { return a.toString(); };
}

ActorServer::ListenerRegistration ActorServer::addEndpointListener(EndpointListener& listener) {
  impl->endpointListeners.push_back(&listener);
  if (impl->state == ServerState::SERVING || impl->state == ServerState::DRAINING) {
    impl->announceTo(listener);
  }
  return ListenerRegistration(*impl, listener);
}

ActorServer::ListenerRegistration::ListenerRegistration(ListenerRegistration&& other) noexcept
    : server(other.server), listener(other.listener) {
  other.server = nullptr;
}

ActorServer::ListenerRegistration& ActorServer::ListenerRegistration::operator=(
    ListenerRegistration&& other) noexcept {
  if (this != &other) {
    release();
    server = other.server;
    listener = other.listener;
    other.server = nullptr;
  }
  return *this;
}

ActorServer::ListenerRegistration::~ListenerRegistration() noexcept(false) { release(); }

void ActorServer::ListenerRegistration::release() {
  if (server == nullptr) return;
  auto& ls = server->endpointListeners;
  ls.erase(std::remove(ls.begin(), ls.end(), listener), ls.end());
  server = nullptr;
}

}  // namespace troupe
