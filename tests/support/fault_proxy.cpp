#include "tests/support/fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include <capnp/serialize.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/address.h"
#include "troupe/net/listen_socket.h"

namespace troupe::test {

namespace {

// Cap'n Proto's readers refuse more segments than this, and so does troupe's.
constexpr uint32_t MAX_SEGMENTS = 512;

// Each direction reads up to this much at once.
constexpr size_t READ_BYTES = 64 * 1024;

bool isLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

// The target in kj::Network's form, once it is known to be a loopback TCP address.
kj::String loopbackTarget(kj::StringPtr target) {
  Address a = Address::parse(target);
  if (a.kind != Address::Kind::TCP) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("a fault proxy forwards plain TCP only, not ", target));
  }
  if (!isLoopbackHost(a.host)) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("a fault proxy forwards to loopback addresses only, not ", target));
  }
  return a.toKjAddress();
}

uint32_t readLe32(const kj::byte* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// What the bytes at the front of a direction's stream say about its next message.
struct Frame {
  bool framed = true;  // false: not Cap'n Proto's framing
  size_t size = 0;     // the whole message's bytes, framing included; 0 until its table is in
};

Frame nextFrame(kj::ArrayPtr<const kj::byte> bytes) {
  if (bytes.size() < 4) return {};
  uint32_t segments = readLe32(bytes.begin()) + 1;
  if (segments == 0 || segments > MAX_SEGMENTS) return {.framed = false};
  size_t table = (segments / 2 + 1) * sizeof(capnp::word);
  if (bytes.size() < table) return {};
  size_t words = 0;
  for (uint32_t i = 0; i < segments; ++i) words += readLe32(bytes.begin() + 4 + i * 4);
  return {.size = table + words * sizeof(capnp::word)};
}

// splitmix64's finalizer: a well-mixed 64-bit hash of `x`.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class LoggingErrorHandler final : public kj::TaskSet::ErrorHandler {
public:
  explicit LoggingErrorHandler(EventLoop& loop) : loop(loop) {}
  void taskFailed(kj::Exception&& e) override {
    loop.logger()->error("fault proxy: {}", e.getDescription().cStr());
  }

private:
  EventLoop& loop;
};

}  // namespace

MessageMatcher messageIs(capnp::rpc::Message::Which which) {
  return [which](capnp::rpc::Message::Reader m) { return m.which() == which; };
}

MessageMatcher callTo(uint64_t interfaceId, uint16_t methodId) {
  return [interfaceId, methodId](capnp::rpc::Message::Reader m) {
    if (!m.isCall()) return false;
    auto call = m.getCall();
    return call.getInterfaceId() == interfaceId && call.getMethodId() == methodId;
  };
}

// One accepted connection and the one made for it to the target: two directions, each read a
// message at a time and forwarded unless a rule or random faults cut the connection there.
class FaultProxy::Connection {
public:
  Connection(FaultProxy& proxy, uint64_t number, kj::Own<kj::AsyncIoStream> clientStream,
             kj::Own<kj::AsyncIoStream> serverStream)
      : proxy(proxy),
        number(number),
        client(kj::mv(clientStream)),
        server(kj::mv(serverStream)),
        up(Direction::CLIENT_TO_SERVER, *client, *server),
        down(Direction::SERVER_TO_CLIENT, *server, *client) {
    proxy.connections.push_back(this);
    ++proxy.stats_.open;
    proxy.notify();
  }

  ~Connection() noexcept(false) {
    auto& list = proxy.connections;
    list.erase(std::remove(list.begin(), list.end(), this), list.end());
    if (!finished) {  // the proxy is going
      --proxy.stats_.open;
    }
  }

  KJ_DISALLOW_COPY(Connection);

  // Starts both directions; resolves once the connection ended or was cut, when it may be
  // dropped (which closes both sockets).
  kj::Promise<void> run() {
    auto paf = kj::newPromiseAndFulfiller<void>();
    done = kj::mv(paf.fulfiller);
    upPump = guarded(up);
    downPump = guarded(down);
    return kj::mv(paf.promise);
  }

  // Ends the connection without counting a cut (stop()).
  void close() { finish(); }

private:
  // Cut before a direction's next message: what another direction's BEFORE_REPLY leaves.
  struct Hold {
    FaultRuleId rule;
    CutKind kind;
  };

  // Where to cut at a message: `bytes` of it go through first.
  struct Cut {
    CutPoint point;
    size_t bytes;
    FaultRuleId rule;
    CutKind kind;
  };

  struct Way {
    Way(Direction direction, kj::AsyncIoStream& from, kj::AsyncIoStream& to)
        : direction(direction), from(from), to(to) {}
    Direction direction;
    kj::AsyncIoStream& from;
    kj::AsyncIoStream& to;
    std::vector<kj::byte> pending;  // read and not yet forwarded
    uint64_t messages = 0;          // messages begun, numbered from 1
    bool framed = true;
    bool ended = false;
    kj::Maybe<Hold> hold;
    std::map<FaultRuleId, uint64_t> matched;  // by rule, the messages it counted here
  };

  Way& other(Way& w) { return &w == &up ? down : up; }

  kj::Promise<void> guarded(Way& w) {
    return pump(w)
        .catch_([this](kj::Exception&&) { finish(); })  // a peer failed: end both
        .eagerlyEvaluate(nullptr);
  }

  kj::Promise<void> pump(Way& w) {
    size_t filled = w.pending.size();
    w.pending.resize(filled + READ_BYTES);
    return w.from.tryRead(w.pending.data() + filled, 1, READ_BYTES)
        .then([this, &w, filled](size_t n) -> kj::Promise<void> {
          w.pending.resize(filled + n);
          if (finished) return kj::READY_NOW;
          if (n == 0) return endOf(w);
          return forwardReady(w).then([this, &w]() -> kj::Promise<void> {
            if (finished) return kj::READY_NOW;
            return pump(w);
          });
        });
  }

  // Forwards every whole message `w` holds, one after another.
  kj::Promise<void> forwardReady(Way& w) {
    if (finished || w.pending.empty()) return kj::READY_NOW;
    if (w.framed) {
      Frame f = nextFrame(kj::arrayPtr(w.pending.data(), w.pending.size()));
      w.framed = f.framed;
      if (f.framed) {
        if (f.size == 0 || w.pending.size() < f.size) {
          if (f.size > w.pending.capacity()) w.pending.reserve(f.size + READ_BYTES);
          return kj::READY_NOW;
        }
        return forwardMessage(w, f.size).then([this, &w]() { return forwardReady(w); });
      }
    }
    return write(w, w.pending.size());
  }

  // Writes the first `bytes` of what `w` holds and lets go of them.
  kj::Promise<void> write(Way& w, size_t bytes) {
    if (bytes == 0) return kj::READY_NOW;
    return w.to.write(w.pending.data(), bytes).then([this, &w, bytes]() {
      w.pending.erase(w.pending.begin(), w.pending.begin() + bytes);
      auto& stats = proxy.stats_;
      (w.direction == Direction::CLIENT_TO_SERVER ? stats.bytesToServer
                                                  : stats.bytesToClient) += bytes;
      proxy.notify();
    });
  }

  // Forwards the whole message of `size` bytes at the front of `w`, or cuts at it.
  kj::Promise<void> forwardMessage(Way& w, size_t size) {
    uint64_t message = ++w.messages;
    KJ_IF_MAYBE(h, w.hold) {
      cut({number, w.direction, message, 0, h->rule, h->kind});
      return kj::READY_NOW;
    }
    KJ_IF_MAYBE(c, decide(w, message, size)) {
      CutRecord record{number, w.direction, message, 0, c->rule, c->kind};
      switch (c->point) {
        case CutPoint::BEFORE:
          cut(record);
          return kj::READY_NOW;
        case CutPoint::INSIDE:
          record.bytesForwarded = std::min(c->bytes, size - 1);
          return write(w, record.bytesForwarded).then([this, record]() { cut(record); });
        case CutPoint::BEFORE_REPLY:
          other(w).hold = Hold{c->rule, c->kind};
          break;
      }
    }
    return write(w, size).then([this, &w]() {
      auto& stats = proxy.stats_;
      ++(w.direction == Direction::CLIENT_TO_SERVER ? stats.messagesToServer
                                                    : stats.messagesToClient);
      proxy.notify();
    });
  }

  // Whether, and where, to cut at message number `message` of `w`, `size` bytes at its front:
  // the first rule that picks it, else random faults.
  kj::Maybe<Cut> decide(Way& w, uint64_t message, size_t size) {
    kj::Maybe<kj::Array<capnp::word>> words;  // the message, aligned, once a matcher needs it
    auto& rules = proxy.rules;
    for (auto it = rules.begin(); it != rules.end(); ++it) {
      FaultRuleId id = (*it)->id;
      FaultRule& rule = (*it)->rule;
      if (rule.direction != w.direction) continue;
      KJ_IF_MAYBE(match, rule.match) {
        if (words == nullptr) {
          auto copy = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
          memcpy(copy.begin(), w.pending.data(), size);
          words = kj::mv(copy);
        }
        if (!matches(*match, KJ_ASSERT_NONNULL(words))) continue;
      }
      if (++w.matched[id] != rule.nth) continue;
      Cut found{rule.point, rule.bytesInside, id, rule.kind};
      if (!rule.everyConnection) rules.erase(it);
      return found;
    }
    KJ_IF_MAYBE(r, proxy.random) {
      uint64_t h = mix(mix(mix(mix(r->seed) ^ number) ^ static_cast<uint64_t>(w.direction)) ^
                       message);
      double draw = static_cast<double>(h >> 11) * 0x1.0p-53;
      if (draw < r->probability) {
        uint64_t where = mix(h);
        if (where & 1) return Cut{CutPoint::BEFORE, 0, 0, r->kind};
        return Cut{CutPoint::INSIDE, 1 + (where >> 1) % (size - 1), 0, r->kind};
      }
    }
    return nullptr;
  }

  static bool matches(MessageMatcher& match, kj::ArrayPtr<const capnp::word> words) {
    bool result = false;
    auto failure = kj::runCatchingExceptions([&]() {
      capnp::ReaderOptions options;
      options.traversalLimitInWords = words.size() * 8 + 1024;
      capnp::FlatArrayMessageReader reader(words, options);
      result = match(reader.getRoot<capnp::rpc::Message>());
    });
    return failure == nullptr && result;  // one that is not an RPC message matches nothing
  }

  // `w`'s source ended: what it left (part of a message at most) goes on, then the end.
  kj::Promise<void> endOf(Way& w) {
    if (w.hold != nullptr && !w.pending.empty()) {
      auto& h = KJ_ASSERT_NONNULL(w.hold);
      cut({number, w.direction, w.messages + 1, 0, h.rule, h.kind});
      return kj::READY_NOW;
    }
    return write(w, w.pending.size()).then([this, &w]() {
      w.to.shutdownWrite();
      w.ended = true;
      if (other(w).ended) finish();
    });
  }

  void cut(const CutRecord& record) {
    if (finished) return;
    if (record.kind == CutKind::RESET) {
      linger l{1, 0};
      for (auto* s : {client.get(), server.get()}) {
        KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                           [&]() { s->setsockopt(SOL_SOCKET, SO_LINGER, &l, sizeof(l)); })) {
          proxy.loop.logger()->warn("fault proxy: cannot reset: {}", e->getDescription().cStr());
        }
      }
    }
    proxy.countCut(record);
    finish(false);
  }

  // No more is forwarded; the connection is dropped on a later turn, closing both sockets.
  void finish(bool ended = true) {
    if (finished) return;
    finished = true;
    --proxy.stats_.open;
    if (ended) ++proxy.stats_.ended;
    proxy.notify();
    KJ_IF_MAYBE(d, done) {
      (*d)->fulfill();
    }
  }

  FaultProxy& proxy;
  uint64_t number;
  kj::Own<kj::AsyncIoStream> client;
  kj::Own<kj::AsyncIoStream> server;
  Way up;    // client to server
  Way down;  // server to client
  bool finished = false;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> done;
  kj::Promise<void> upPump = nullptr;  // last: dropped before the ways and streams they use
  kj::Promise<void> downPump = nullptr;
};

FaultProxy::FaultProxy(EventLoop& loop, kj::StringPtr targetAddress)
    : loop(loop),
      target(loopbackTarget(targetAddress)),
      errorHandler(kj::heap<LoggingErrorHandler>(loop)),
      tasks(kj::heap<kj::TaskSet>(*errorHandler)) {
  auto socket = openListenSocket(loop.lowLevelIo(), Address::parse("tcp://127.0.0.1:0"));
  port = socket.bound.port;
  listener = kj::mv(socket.receiver);
  accepting = acceptLoop().eagerlyEvaluate([this](kj::Exception&& e) {
    this->loop.logger()->error("fault proxy: accepting failed: {}", e.getDescription().cStr());
  });
}

FaultProxy::~FaultProxy() noexcept(false) {
  accepting = nullptr;
  listener = nullptr;
  tasks = nullptr;
}

std::string FaultProxy::address() const { return "tcp://127.0.0.1:" + std::to_string(port); }

FaultRuleId FaultProxy::addRule(FaultRule rule) {
  KJ_REQUIRE(rule.nth >= 1, "a fault rule counts messages from 1");
  KJ_REQUIRE(rule.point != CutPoint::INSIDE || rule.bytesInside >= 1,
             "a cut inside a message lets at least one of its bytes through");
  FaultRuleId id = ++lastRule;
  rules.push_back(kj::heap<ActiveRule>(ActiveRule{id, kj::mv(rule)}));
  return id;
}

void FaultProxy::removeRule(FaultRuleId id) {
  rules.erase(std::remove_if(rules.begin(), rules.end(),
                             [id](const kj::Own<ActiveRule>& r) { return r->id == id; }),
              rules.end());
}

void FaultProxy::setRandomFaults(kj::Maybe<RandomFaults> faults) {
  KJ_IF_MAYBE(given, faults) {
    KJ_REQUIRE(given->probability >= 0 && given->probability <= 1, "a probability is in [0, 1]",
               given->probability);
  }
  random = faults;
}

uint64_t FaultProxy::cutsBy(FaultRuleId rule) const {
  auto it = cutsByRule.find(rule);
  return it == cutsByRule.end() ? 0 : it->second;
}

void FaultProxy::stop() {
  stopped = true;
  accepting = nullptr;
  listener = nullptr;
  for (auto* c : std::vector<Connection*>(connections)) c->close();
}

kj::Promise<void> FaultProxy::acceptLoop() {
  return listener->accept().then([this](kj::Own<kj::AsyncIoStream> client) {
    accepted(kj::mv(client));
    return acceptLoop();
  });
}

void FaultProxy::accepted(kj::Own<kj::AsyncIoStream> client) {
  uint64_t number = ++stats_.accepted;
  notify();
  auto connected = loop.network().parseAddress(target).then(
      [](kj::Own<kj::NetworkAddress> a) { return a->connect().attach(kj::mv(a)); });
  tasks->add(connected.then(
      [this, number,
       client = kj::mv(client)](kj::Own<kj::AsyncIoStream> server) mutable -> kj::Promise<void> {
        if (stopped) {  // accepted before stop(), connected after: closed like the others
          ++stats_.ended;
          notify();
          return kj::READY_NOW;
        }
        auto c = kj::heap<Connection>(*this, number, kj::mv(client), kj::mv(server));
        auto done = c->run();
        return done.attach(kj::mv(c));
      },
      [this](kj::Exception&&) -> kj::Promise<void> {
        ++stats_.unreachable;
        notify();
        return kj::READY_NOW;
      }));
}

void FaultProxy::countCut(const CutRecord& record) {
  ++stats_.cut;
  if (record.rule == 0) {
    ++stats_.randomCuts;
  } else {
    ++cutsByRule[record.rule];
  }
  cuts_.add(record);
}

}  // namespace troupe::test
