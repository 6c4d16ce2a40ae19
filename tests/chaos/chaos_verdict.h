#pragma once
// The rules every call of a chaos run keeps, checked against what its caller saw and what the
// replicas' ledgers say ran.
//
// Every call:         its promise settled (none hung), at most `margin` after its deadline.
// idempotentOp:       succeeded, or failed with DEADLINE_EXCEEDED; or with NO_ENDPOINTS, and
//                     then no member was READY at any moment of the call (which is what the pool
//                     promises: NO_ENDPOINTS means no member was ever ready for it).
// recordOnce:         ran at most once (its id is in the ledgers at most once); ran exactly once
//                     when it succeeded; failed only with MAY_HAVE_RUN, DEADLINE_EXCEEDED (ran
//                     once or never), or a code that says it never ran (callNeverRan(): then it
//                     is in no ledger).
// The ledgers:        hold only ids of recordOnce calls the load sent.

#include <string>
#include <vector>

#include <kj/time.h>

#include "tests/chaos/call_load.h"
#include "tests/chaos/ledger.h"
#include "tests/chaos/readiness_log.h"

namespace troupe::chaos {

struct Verdict {
  // One line per broken rule, naming the call.
  std::vector<std::string> violations;
  // For the report: per kind, how many calls ended how ("idempotentOp: 9120 calls: 9050 ok,
  // 70 deadline_exceeded"), and what the ledgers hold.
  std::vector<std::string> counts;
};

Verdict judge(const std::vector<CallRecord>& calls, const LedgerContents& ledger,
              const ReadinessLog& readiness, kj::Duration deadline, kj::Duration margin);

}  // namespace troupe::chaos
