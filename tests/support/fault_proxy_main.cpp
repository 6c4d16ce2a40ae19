// FaultProxy (fault_proxy.h) as a program, for the tests written in Python and shell: forwards
// 127.0.0.1:<any port> to TARGET, cutting connections where its flags say. Prints
// "LISTENING tcp://127.0.0.1:PORT" once it listens, "CUT <connection> <message>" at each cut,
// and on SIGTERM or SIGINT "STATS <accepted> <cut>" before it exits.
//
//   troupe_test_fault_proxy TARGET [--cut-once-call before|before-reply] [--nth N]
//                                  [--random SEED PER_THOUSAND]
//
// --cut-once-call cuts the first connection that carries an N-th (default first) call sent as
// ExactlyOnce (how every call not marked idempotent travels): before it reaches the server, or
// after it arrived and before its reply leaves. --random cuts at random points (RandomFaults):
// at PER_THOUSAND messages of every thousand, on average.

#include <signal.h>
#include <stdio.h>

#include <kj/debug.h>

#include "troupe/base/event_loop.h"
#include "troupe/base/parse_number.h"
#include "troupe/schemas/actor.capnp.h"
#include "tests/support/fault_proxy.h"

namespace {

using troupe::test::CutPoint;
using troupe::test::FaultRule;

int usage(const char* why) {
  fprintf(stderr,
          "%s\nusage: troupe_test_fault_proxy TARGET [--cut-once-call before|before-reply] "
          "[--nth N] [--random SEED PER_THOUSAND]\n",
          why);
  return 2;
}

// The rule --cut-once-call asks for: `point` relative to the N-th ExactlyOnce call.
kj::Maybe<FaultRule> onceCallRule(kj::StringPtr point, uint64_t nth) {
  FaultRule rule{.nth = nth, .match = troupe::test::callTo<troupe::schema::ExactlyOnce>(0)};
  if (point == "before") {
    rule.point = CutPoint::BEFORE;
  } else if (point == "before-reply") {
    rule.point = CutPoint::BEFORE_REPLY;
  } else {
    return nullptr;
  }
  return kj::mv(rule);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("no TARGET");
  kj::StringPtr target = argv[1];
  kj::StringPtr cut;
  uint64_t nth = 1;
  kj::Maybe<troupe::test::RandomFaults> random;
  for (int i = 2; i < argc; ++i) {
    kj::StringPtr flag = argv[i];
    if (flag == "--cut-once-call" && i + 1 < argc) {
      cut = argv[++i];
    } else if (flag == "--nth" && i + 1 < argc) {
      nth = troupe::parseWholeNumber(kj::StringPtr(argv[++i])).orDefault(0);
      if (nth == 0) return usage("--nth is a whole number from 1");
    } else if (flag == "--random" && i + 2 < argc) {
      auto seed = troupe::parseWholeNumber(kj::StringPtr(argv[i + 1]));
      auto perThousand = troupe::parseWholeNumber(kj::StringPtr(argv[i + 2]), 1000);
      if (seed == nullptr || perThousand == nullptr) {
        return usage("--random takes a whole number and one from 0 to 1000");
      }
      random = troupe::test::RandomFaults{
          .seed = KJ_ASSERT_NONNULL(seed),
          .probability = static_cast<double>(KJ_ASSERT_NONNULL(perThousand)) / 1000};
      i += 2;
    } else {
      return usage(kj::str("unknown or incomplete flag ", flag).cStr());
    }
  }
  troupe::EventLoop loop;
  troupe::test::FaultProxy proxy(loop, target);
  if (cut != nullptr) {
    KJ_IF_MAYBE(rule, onceCallRule(cut, nth)) {
      proxy.addRule(kj::mv(*rule));
    } else {
      return usage(kj::str("unknown cut point ", cut).cStr());
    }
  }
  proxy.setRandomFaults(kj::mv(random));
  printf("LISTENING %s\n", proxy.address().c_str());
  fflush(stdout);
  auto signalled = loop.onSignal({SIGTERM, SIGINT}).fork();
  bool done = false;
  size_t printed = 0;
  while (!done) {
    auto stopping = signalled.addBranch().then([&done](int) { done = true; });
    proxy.changed().exclusiveJoin(kj::mv(stopping)).wait(loop.waitScope());
    auto cuts = proxy.cuts();
    for (; printed < cuts.size(); ++printed) {
      printf("CUT %llu %llu\n", (unsigned long long)cuts[printed].connection,
             (unsigned long long)cuts[printed].message);
    }
    fflush(stdout);
  }
  printf("STATS %llu %llu\n", (unsigned long long)proxy.stats().accepted,
         (unsigned long long)proxy.stats().cut);
  fflush(stdout);
  proxy.stop();
  return 0;
}
