#pragma once
// FaultProxy: a loopback TCP proxy that cuts connections where a test says, counted in Cap'n
// Proto messages: before a request reaches the server, after it arrived but before its reply
// leaves, in the middle of the reply; or at random points from a seed. For tests of what a
// caller can know about a call whose connection broke.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <capnp/rpc.capnp.h>
#include <kj/async-io.h>
#include <kj/function.h>
#include <kj/vector.h>

#include "troupe/base/change_signal.h"
#include "troupe/base/event_loop.h"

namespace troupe::test {

// One way through the proxy.
enum class Direction : uint8_t { CLIENT_TO_SERVER, SERVER_TO_CLIENT };

// How a connection is cut. Either way the proxy forwards nothing more on it, in either
// direction, and drops whatever it had read and not yet forwarded.
enum class CutKind : uint8_t {
  // Both sockets are closed: each peer reads the end of its stream after what was forwarded
  // (the kernel sends a reset instead where it still holds bytes the proxy had not read).
  CLOSE,
  // Both sockets are reset (SO_LINGER 0): each peer's next read or write fails, and bytes still
  // in flight may be lost.
  RESET,
};

// Where a rule cuts the connection, relative to the message it picked.
enum class CutPoint : uint8_t {
  // None of the message goes through.
  BEFORE,
  // The message goes through whole; the connection is cut when the other direction is about to
  // forward its next message, which does not go through. For a request: it arrived, and the
  // reply does not leave.
  BEFORE_REPLY,
  // FaultRule::bytesInside bytes of the message go through, then the connection is cut.
  INSIDE,
};

// Which messages a rule counts: given each message of its direction as Cap'n Proto's RPC
// protocol reads it. A message that does not parse as one counts for no matcher.
using MessageMatcher = kj::Function<bool(capnp::rpc::Message::Reader)>;

// Matches every message of the kind `which` (CALL, RETURN, FINISH, BOOTSTRAP, ...).
MessageMatcher messageIs(capnp::rpc::Message::Which which);

// Matches a call of method `methodId` (its ordinal in the schema) of the interface with type id
// `interfaceId` (a method an interface inherits is called with its parent's id).
MessageMatcher callTo(uint64_t interfaceId, uint16_t methodId);

// The same, with the interface as a generated type: callTo<Calculator>(0) for Calculator.add.
template <typename Interface>
MessageMatcher callTo(uint16_t methodId) {
  return callTo(capnp::typeId<Interface>(), methodId);
}

// A cut the test asks for: "on a connection, when the `nth` message in `direction` that `match`
// accepts comes, cut at `point`". Messages are counted on each connection from when the rule
// applies to it: from its start for a connection accepted after addRule(), from addRule() for
// one open then (so a test can make a connection first and pick a message of its next call).
struct FaultRule {
  // The direction whose messages the rule counts. Default: client to server.
  Direction direction = Direction::CLIENT_TO_SERVER;

  // Which of the matching messages is cut at, 1 for the first. Default 1.
  uint64_t nth = 1;

  // Which messages count. Default: null, every message.
  kj::Maybe<MessageMatcher> match;

  // Where the cut goes. Default: before the message.
  CutPoint point = CutPoint::BEFORE;

  // CutPoint::INSIDE only: how many of the message's bytes (its framing included) go through
  // before the cut; at least 1, and at most the message's size less one (a larger value is
  // taken as that). Default 0, which addRule() refuses with INSIDE.
  size_t bytesInside = 0;

  // How the connection is cut. Default: closed.
  CutKind kind = CutKind::CLOSE;

  // Whether the rule cuts every connection that reaches its message (true), or only the first
  // one that does, after which it is spent (false, the default): a client that connects again
  // then gets through, unless another rule says otherwise.
  bool everyConnection = false;
};

// Names a rule (FaultProxy::addRule); 1 for the first rule of a proxy, then 2, 3, ...
using FaultRuleId = uint64_t;

// Cuts at random points: at each message of either direction, with `probability`, the
// connection is cut there, as often before the message as inside it (after a number of its bytes
// drawn uniformly from 1 to its size less one). Each draw is a hash of the seed, the
// connection's number (1 for the first the proxy accepted), the direction and the message's
// number on it, not the next value of a generator, so that which messages are cut and where
// depends only on the seed and the messages each connection carries, not on how the two
// directions' messages interleave. (Where both directions come to a message to cut at, the one
// the proxy reads first cuts; traffic that takes turns, such as calls made one at a time on
// connections made one at a time, is cut the same way in every run.)
struct RandomFaults {
  // Default 0.
  uint64_t seed = 0;
  // The chance that a message is where its connection is cut, in [0, 1]. Default 0: never.
  double probability = 0;
  // How connections are cut. Default: closed.
  CutKind kind = CutKind::CLOSE;
};

// One cut, as FaultProxy::cuts() lists it.
struct CutRecord {
  uint64_t connection = 0;  // its number: 1 for the first connection the proxy accepted
  Direction direction = Direction::CLIENT_TO_SERVER;  // of the message cut at
  uint64_t message = 0;         // that message's number in its direction, 1 for the first
  uint64_t bytesForwarded = 0;  // how many of its bytes went through: 0 unless cut inside it
  FaultRuleId rule = 0;         // the rule that cut; 0 for random faults
  CutKind kind = CutKind::CLOSE;

  bool operator==(const CutRecord&) const = default;
};

// What a proxy has done, for a test to assert on. Connections end one way: ended by their
// peers, cut, or never connected to the target.
struct FaultProxyStats {
  uint64_t accepted = 0;     // connections accepted
  uint64_t unreachable = 0;  // accepted, but the target refused: closed at once
  uint64_t open = 0;         // being forwarded now
  uint64_t ended = 0;        // ended by their peers: both sides shut down, or one failed, or stop()
  uint64_t cut = 0;          // cut by a rule or by random faults
  uint64_t randomCuts = 0;   // of those, by random faults
  uint64_t messagesToServer = 0;  // whole messages forwarded client to server
  uint64_t messagesToClient = 0;  // and server to client
  uint64_t bytesToServer = 0;     // bytes forwarded client to server, partial messages included
  uint64_t bytesToClient = 0;     // and server to client
};

// Listens on 127.0.0.1, on a port the kernel picks, and forwards each connection it accepts to
// its target, both ways, byte for byte, cutting it where a rule or random faults say. Each
// direction is read as Cap'n Proto's standard stream framing (serialize.h: segment count less
// one, segment sizes, padding to a word, the segments), which troupe's connections keep; a
// message is forwarded once the proxy has it whole, so a cut never falls inside one unless it
// is meant to. A stream that is not such framing (a segment count of 0 or over 512) is forwarded
// as it comes from there on, with no messages counted and no rules or random faults applied to
// it.
//
// Belongs to `loop` and its thread; the target need not outlive it (connections to a target
// that went away are counted unreachable). Dropping the proxy closes its listener and every
// connection at once.
class FaultProxy {
public:
  // Forwards to `target`, "tcp://HOST:PORT" or "HOST:PORT" with HOST an address in 127.0.0.0/8,
  // ::1, or "localhost"; throws INVALID_ARGUMENT (errors.h) for anything else, a tls:// or
  // unix: address included. Listens at once.
  FaultProxy(EventLoop& loop, kj::StringPtr target);
  ~FaultProxy() noexcept(false);
  KJ_DISALLOW_COPY(FaultProxy);

  // Where clients connect: "tcp://127.0.0.1:PORT".
  std::string address() const;

  // Adds a cut (FaultRule says which and where). Rules are looked at in the order they were
  // added; a message that two rules pick is cut by the first. Throws (KJ_REQUIRE) for nth 0, or
  // INSIDE with bytesInside 0.
  FaultRuleId addRule(FaultRule rule);

  // Withdraws a rule, spent or not; its cuts stay counted. Unknown ids are ignored.
  void removeRule(FaultRuleId id);

  // Starts cutting at random (RandomFaults), on the connections open now and later, in
  // addition to the rules (which a message is looked at by first); null stops it.
  void setRandomFaults(kj::Maybe<RandomFaults> faults);

  // Counts so far.
  const FaultProxyStats& stats() const { return stats_; }

  // How many connections `rule` has cut.
  uint64_t cutsBy(FaultRuleId rule) const;

  // Every cut so far, in the order they happened.
  kj::ArrayPtr<const CutRecord> cuts() const { return cuts_; }

  // Resolves at the next change of stats(): a connection accepted, ended or cut, a message
  // forwarded. A test waits for what it expects in a loop over it.
  kj::Promise<void> changed() { return signal.next(); }

  // Stops accepting, and closes every open connection (counted as ended) on the loop's next
  // turn. The proxy is done afterwards; address() still says where it listened. Not from inside
  // a continuation of the proxy's own.
  void stop();

private:
  class Connection;
  struct ActiveRule {
    FaultRuleId id;
    FaultRule rule;
  };

  kj::Promise<void> acceptLoop();
  void accepted(kj::Own<kj::AsyncIoStream> client);
  void countCut(const CutRecord& record);
  void notify() { signal.notify(); }

  EventLoop& loop;
  kj::String target;  // in kj::Network's form
  uint16_t port;
  std::vector<kj::Own<ActiveRule>> rules;  // in force, in the order added
  FaultRuleId lastRule = 0;
  std::map<FaultRuleId, uint64_t> cutsByRule;
  kj::Maybe<RandomFaults> random;
  FaultProxyStats stats_;
  kj::Vector<CutRecord> cuts_;
  ChangeSignal signal;
  std::vector<Connection*> connections;  // open, each owned by its task in `tasks`
  kj::Own<kj::TaskSet::ErrorHandler> errorHandler;
  kj::Own<kj::TaskSet> tasks;  // one per connection: dropped before what they use
  bool stopped = false;
  kj::Own<kj::ConnectionReceiver> listener;  // null once stopped
  kj::Promise<void> accepting = nullptr;     // on `listener`: dropped before it
};

}  // namespace troupe::test
