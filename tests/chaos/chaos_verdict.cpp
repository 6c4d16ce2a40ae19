#include "tests/chaos/chaos_verdict.h"

#include <map>
#include <set>

namespace troupe::chaos {

namespace {

// "ok", "hung", or the error's code ("may_have_run").
std::string outcomeOf(const CallRecord& call) {
  if (call.hung) return "hung";
  KJ_IF_MAYBE(code, call.error) {
    return errorCodeName(*code).cStr();
  }
  return "ok";
}

std::string named(const CallRecord& call) {
  return std::string(toString(call.kind)) + " #" + std::to_string(call.id);
}

long long ms(kj::Duration d) { return static_cast<long long>(d / kj::MILLISECONDS); }

class Judge {
public:
  Judge(const LedgerContents& ledger, const ReadinessLog& readiness, kj::Duration deadline,
        kj::Duration margin)
      : ledger(ledger), readiness(readiness), deadline(deadline), margin(margin) {}

  void check(const CallRecord& call) {
    if (call.hung) {
      fail(call, "never settled: given up on " + std::to_string(ms(call.took)) + " ms on");
      return;
    }
    if (call.took > deadline + margin) {
      fail(call, "settled " + std::to_string(ms(call.took)) + " ms after it was sent, past its " +
                     std::to_string(ms(deadline)) + " ms deadline and the " +
                     std::to_string(ms(margin)) + " ms margin");
    }
    if (call.kind == CallKind::IDEMPOTENT) {
      checkIdempotent(call);
    } else {
      recordOnceIds.insert(call.id);
      checkRecordOnce(call);
    }
  }

  // Ids in the ledgers that no recordOnce call carried.
  void checkLedger() {
    for (auto& [id, files] : ledger.runs) {
      if (recordOnceIds.count(id) == 0) {
        violations.push_back("the ledger " + ledger.files[files[0]] + " holds id " +
                             std::to_string(id) + ", which no recordOnce call carried");
      }
    }
  }

  std::vector<std::string> violations;
  size_t ranThoughFailed = 0;

private:
  void checkIdempotent(const CallRecord& call) {
    KJ_IF_MAYBE(code, call.error) {
      if (*code == ErrorCode::DEADLINE_EXCEEDED) return;
      if (*code == ErrorCode::NO_ENDPOINTS) {
        size_t most = readiness.mostReadyBetween(call.start, call.start + call.took);
        if (most > 0) {
          fail(call, "failed with no_endpoints while " + std::to_string(most) +
                         " member(s) were ready: " + call.message);
        }
        return;
      }
      fail(call, "failed, an idempotent call, before its deadline: " + call.message);
    }
  }

  void checkRecordOnce(const CallRecord& call) {
    auto it = ledger.runs.find(call.id);
    size_t runs = it == ledger.runs.end() ? 0 : it->second.size();
    if (runs > 1) {
      std::string where;
      for (auto f : it->second) where += " " + ledger.files[f];
      fail(call,
           "ran " + std::to_string(runs) + " times, in" + where + " (" + outcomeOf(call) + ")");
    }
    KJ_IF_MAYBE(code, call.error) {
      if (runs > 0) ++ranThoughFailed;
      if (*code == ErrorCode::MAY_HAVE_RUN || *code == ErrorCode::DEADLINE_EXCEEDED) return;
      if (!callNeverRan(*code)) {
        fail(call, "failed with a code that is neither may_have_run, deadline_exceeded nor one "
                   "that says it never ran: " +
                       call.message);
      } else if (runs > 0) {
        fail(call, "ran, though its error says it never did: " + call.message);
      }
    } else if (runs == 0) {
      fail(call, "succeeded, yet no ledger holds it");
    }
  }

  void fail(const CallRecord& call, const std::string& what) {
    violations.push_back(named(call) + " " + what);
  }

  const LedgerContents& ledger;
  const ReadinessLog& readiness;
  const kj::Duration deadline;
  const kj::Duration margin;
  std::set<uint64_t> recordOnceIds;
};

std::string countsOf(CallKind kind, const std::vector<CallRecord>& calls) {
  std::map<std::string, size_t> byOutcome;
  size_t total = 0;
  for (auto& c : calls) {
    if (c.kind != kind) continue;
    ++total;
    ++byOutcome[outcomeOf(c)];
  }
  std::string line = std::string(toString(kind)) + ": " + std::to_string(total) + " calls";
  // "ok" first, then the errors by name.
  std::string sep = ": ";
  if (byOutcome.count("ok") > 0) {
    line += sep + std::to_string(byOutcome["ok"]) + " ok";
    sep = ", ";
  }
  for (auto& [outcome, n] : byOutcome) {
    if (outcome == "ok") continue;
    line += sep + std::to_string(n) + " " + outcome;
    sep = ", ";
  }
  return line;
}

}  // namespace

Verdict judge(const std::vector<CallRecord>& calls, const LedgerContents& ledger,
              const ReadinessLog& readiness, kj::Duration deadline, kj::Duration margin) {
  Judge judge(ledger, readiness, deadline, margin);
  for (auto& call : calls) judge.check(call);
  judge.checkLedger();

  Verdict verdict;
  verdict.violations = kj::mv(judge.violations);
  verdict.counts.push_back(countsOf(CallKind::IDEMPOTENT, calls));
  verdict.counts.push_back(countsOf(CallKind::RECORD_ONCE, calls));
  verdict.counts.push_back(
      "ledgers: " + std::to_string(ledger.runs.size()) + " call ids in " +
      std::to_string(ledger.files.size()) + " files (" + std::to_string(judge.ranThoughFailed) +
      " of them ran for calls that failed), " + std::to_string(ledger.tornLines) + " torn lines");
  return verdict;
}

}  // namespace troupe::chaos
