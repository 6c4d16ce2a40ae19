#include "troupe/net/detail/incoming_budget.h"

#include <algorithm>

#include <kj/debug.h>

namespace troupe::net_detail {

IncomingBudget::IncomingBudget(uint64_t maxBytes) : maxBytes(maxBytes) {}

IncomingBudget::~IncomingBudget() noexcept(false) {}

kj::Own<IncomingBudget::Claim> IncomingBudget::claim(uint64_t bytes, kj::StringPtr peer) {
  return kj::heap<Claim>(*this, bytes, peer);
}

uint64_t IncomingBudget::grantable(const Claim& c) const {
  if (c.granted == 0) {
    if (held_ == 0) return c.size;  // alone: whatever its size, so it never waits forever
    if (c.size <= free() && wholeHeld + c.size <= maxBytes / 2) return c.size;
  }
  // Only a message that could be completed from what is free now is granted more: then the
  // messages holding part of the budget can always finish one after another, never all waiting
  // for each other.
  uint64_t need = c.size - c.granted;
  if (need > free()) return 0;
  return std::min(need, BUDGET_STEP_BYTES);
}

bool IncomingBudget::withinShares(const Claim& c) const {
  if (c.granted >= maxBytes / claims) return false;
  KJ_IF_MAYBE(p, c.peer) {
    return (*p)->second.held < maxBytes / (peers.size() + ungrouped);
  }
  return true;
}

void IncomingBudget::give(Claim& c, uint64_t bytes) {
  if (c.granted == 0 && bytes == c.size) {
    c.grantedWhole = true;
    wholeHeld += bytes;
  }
  c.granted += bytes;
  held_ += bytes;
  KJ_IF_MAYBE(p, c.peer) {
    (*p)->second.held += bytes;
  }
}

void IncomingBudget::grant() {
  // First the claims within their fair shares, then, with what they could not use, the others.
  for (bool sharesOnly : {true, false}) {
    for (auto it = waiters.begin(); it != waiters.end();) {
      Claim& c = **it;
      auto& fulfiller = KJ_ASSERT_NONNULL(c.fulfiller);
      if (!fulfiller->isWaiting()) {  // its read was given up: it asks again if it goes on
        c.fulfiller = nullptr;
        it = waiters.erase(it);
        continue;
      }
      uint64_t bytes = sharesOnly && !withinShares(c) ? 0 : grantable(c);
      if (bytes == 0) {
        ++it;
        continue;
      }
      give(c, bytes);
      it = waiters.erase(it);
      auto granted = kj::mv(fulfiller);
      c.fulfiller = nullptr;
      granted->fulfill();
    }
  }
}

// ------------------------------------------------------------------------------------------------

IncomingBudget::Claim::Claim(IncomingBudget& budget, uint64_t bytes, kj::StringPtr peerHost)
    : budget(budget), size(bytes) {
  KJ_REQUIRE(bytes > 0);
  ++budget.claims;
  if (peerHost.size() == 0) {
    ++budget.ungrouped;
  } else {
    auto it = budget.peers.emplace(std::string(peerHost.cStr()), Peer{}).first;
    ++it->second.claims;
    peer = it;
  }
}

IncomingBudget::Claim::~Claim() noexcept(false) {
  if (fulfiller != nullptr) budget.waiters.erase(place);
  budget.held_ -= granted;
  if (grantedWhole) budget.wholeHeld -= granted;
  --budget.claims;
  KJ_IF_MAYBE(p, peer) {
    (*p)->second.held -= granted;
    if (--(*p)->second.claims == 0) budget.peers.erase(*p);
  } else {
    --budget.ungrouped;
  }
  budget.grant();  // room, and larger shares for the others
}

kj::Promise<void> IncomingBudget::Claim::more() {
  KJ_REQUIRE(unused() == 0 && granted < size && fulfiller == nullptr);
  if (budget.waiters.empty()) {
    uint64_t bytes = budget.grantable(*this);
    if (bytes > 0) {
      budget.give(*this, bytes);
      return kj::READY_NOW;
    }
  }
  auto paf = kj::newPromiseAndFulfiller<void>();
  fulfiller = kj::mv(paf.fulfiller);
  place = budget.waiters.insert(budget.waiters.end(), this);
  budget.grant();
  return kj::mv(paf.promise);
}

void IncomingBudget::Claim::use(uint64_t bytes) {
  KJ_ASSERT(bytes <= unused(), "read past what the budget granted", bytes, unused());
  used += bytes;
}

}  // namespace troupe::net_detail
