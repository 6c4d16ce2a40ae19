#pragma once
// The bytes that messages still arriving may hold across a server's connections
// (ConnectionLimits::maxIncompleteMessageBytes), and how they are shared so that no connection,
// nor any group of connections from one address, can keep the others' messages waiting.

#include <stdint.h>

#include <list>
#include <map>
#include <string>

#include <kj/async.h>

namespace troupe::net_detail {

// A message read in steps is granted this much of the budget at a time (or what is left of it).
constexpr uint64_t BUDGET_STEP_BYTES = 1024 * 1024;

// The rules, in the order they apply to a message of S bytes (ConnectionLimits says the same to
// users):
//
// * Whole: a message is granted all of S at once when nothing is held (a message alone always
//   gets in, whatever its size), or when S fits in what is free and the messages granted whole
//   hold at most half of the budget with it. Its memory may then come from the thread's buffer
//   cache (resident at once), which is why it counts whole; the half kept from whole grants is
//   what messages that stall after their first bytes cannot take from the others.
// * In steps: otherwise it is granted BUDGET_STEP_BYTES at a time, each step before it is read,
//   so it holds what has arrived plus one step.
// * No deadlock: a message is granted a step only when what is free would let it complete (its
//   remaining bytes fit), so messages arriving together always leave one that can finish.
// * Fair shares: waiting messages are served in the order they asked, first those whose message
//   holds less than budget / messages arriving and whose peer address holds less than budget /
//   addresses sending them; the others only when none of those can be granted, so the budget is
//   never idle while a message could use it.
//
// Loop thread only; outlives its claims.
class IncomingBudget {
public:
  explicit IncomingBudget(uint64_t maxBytes);
  ~IncomingBudget() noexcept(false);
  KJ_DISALLOW_COPY(IncomingBudget);

  class Claim;

  // The claim of one message of `bytes` bytes from `peer` (its host address without the port;
  // empty: a group of its own). It holds nothing until granted (Claim::more()); dropping it gives
  // back what it holds.
  kj::Own<Claim> claim(uint64_t bytes, kj::StringPtr peer);

  // Bytes granted to claims now.
  uint64_t held() const { return held_; }
  // Claims waiting for a grant now.
  size_t waiting() const { return waiters.size(); }

private:
  struct Peer {
    uint64_t held = 0;
    uint32_t claims = 0;
  };
  using PeerMap = std::map<std::string, Peer>;

  uint64_t free() const { return held_ >= maxBytes ? 0 : maxBytes - held_; }
  // What `c` may be granted now under the rules above, ignoring the fair shares; 0 for nothing.
  uint64_t grantable(const Claim& c) const;
  bool withinShares(const Claim& c) const;
  void give(Claim& c, uint64_t bytes);
  // Grants what can be granted to the waiting claims, as the rules say.
  void grant();

  const uint64_t maxBytes;
  uint64_t held_ = 0;
  uint64_t wholeHeld = 0;     // by claims granted whole
  uint32_t claims = 0;        // alive
  uint32_t ungrouped = 0;     // claims with no peer address, each a group of its own
  PeerMap peers;              // by host address, those with claims
  std::list<Claim*> waiters;  // in the order they asked
};

// One message's share of the budget. Belongs to the connection reading the message.
class IncomingBudget::Claim {
public:
  Claim(IncomingBudget& budget, uint64_t bytes, kj::StringPtr peer);
  ~Claim() noexcept(false);
  KJ_DISALLOW_COPY(Claim);

  // Resolves once more bytes are granted: the whole message at once or a step (see the rules).
  // Only when everything granted has been used and the message is not complete. Dropping the
  // promise gives up the place in line.
  kj::Promise<void> more();

  // Granted and not yet used.
  uint64_t unused() const { return granted - used; }
  // `bytes` of the message have been read into its memory.
  void use(uint64_t bytes);
  // Granted all at once (see the rules): its memory may be resident at once.
  bool whole() const { return grantedWhole; }

private:
  friend class IncomingBudget;

  IncomingBudget& budget;
  const uint64_t size;
  kj::Maybe<PeerMap::iterator> peer;  // null when ungrouped
  uint64_t granted = 0;
  uint64_t used = 0;
  bool grantedWhole = false;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> fulfiller;  // while it waits
  std::list<Claim*>::iterator place;                         // in waiters, while it waits
};

}  // namespace troupe::net_detail
