// troupe's parsers of text from users and peers, fed arbitrary text. The first input byte picks
// the parser (its distance from '0', modulo 7: the seeds start with the digit), the rest is its
// text:
//
//   0  Address::parse            addresses ("tcp://host:port", "unix:/path", ...)
//   1  parseEndpointName         endpoint names, with validateJobId / validateActorName
//   2  parseWholeNumber          numbers, against a plain reading of the rule
//   3  openResolver              resolver URLs (registry:, fixed:; nothing is contacted)
//   4  FixedResolver::parseFile  fixed-resolver files, and the same text as a fixed: spec
//   5  validatePrefix            resolver prefixes, with jobOverlapsPrefix
//   6  JobContext                the environment, given as NAME=VALUE lines
//
// Refusals (INVALID_ARGUMENT) are fine. Checked: what parses prints in a canonical form that
// parses back to the same value, numbers are what their digits say, and what the parsers accept
// holds to the rules their headers state.

#include <string.h>

#include <map>
#include <string>

#include "troupe/actor/endpoint.h"
#include "troupe/actor/job_context.h"
#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/base/parse_number.h"
#include "troupe/net/address.h"
#include "troupe/resolver/fixed_resolver.h"
#include "troupe/resolver/open_resolver.h"
#include "fuzz/fuzz_support.h"

namespace troupe::fuzz {
namespace {

// Runs `fn`, taking INVALID_ARGUMENT as the parser's refusal; any other exception is a bug.
template <typename Fn>
void parse(Fn&& fn) {
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(kj::fwd<Fn>(fn))) {
    if (errorCode(*e) != ErrorCode::INVALID_ARGUMENT) {
      fprintf(stderr, "fuzz: %s\n", e->getDescription().cStr());
      check(false, "a parser failed with something other than INVALID_ARGUMENT");
    }
  }
}

void address(kj::StringPtr text) {
  parse([&]() {
    auto a = Address::parse(text);
    auto canonical = a.toString();
    check(Address::parse(canonical) == a, "an address does not parse back from its canonical form");
    check(Address::parse(canonical).toString() == canonical, "a canonical address changed");
    a.toKjAddress();
  });
}

void endpointNames(kj::StringPtr text) {
  bool validJob = kj::runCatchingExceptions([&]() { validateJobId(text); }) == nullptr;
  bool validActor = kj::runCatchingExceptions([&]() { validateActorName(text); }) == nullptr;
  // The two follow one rule.
  check(validJob == validActor, "job ids and actor names follow different rules");
  if (validJob) {
    check(text.size() > 0 && text.size() <= MAX_NAME_LENGTH, "a name of a bad length passed");
    check(strlen(text.cStr()) == text.size(), "a name with a NUL byte passed");
  }
  KJ_IF_MAYBE(parts, parseEndpointName(text)) {
    check(endpointName(parts->jobId, parts->actor, parts->taskIndex) == std::string(text.cStr()),
          "an endpoint name does not rebuild from its parts");
  }
}

// The rule parseWholeNumber states, read plainly.
kj::Maybe<uint64_t> wholeNumber(kj::ArrayPtr<const char> text, uint64_t max) {
  if (text.size() == 0) return nullptr;
  uint64_t value = 0;
  for (char c : text) {
    if (!isDigit(c)) return nullptr;
    uint64_t digit = c - '0';
    if (value > (UINT64_MAX - digit) / 10) return nullptr;
    value = value * 10 + digit;
  }
  if (value > max) return nullptr;
  return value;
}

void numbers(kj::ArrayPtr<const char> text) {
  for (uint64_t max : {UINT64_MAX, uint64_t{UINT32_MAX}, uint64_t{65535}, uint64_t{0}}) {
    check(parseWholeNumber(text, max) == wholeNumber(text, max), "parseWholeNumber misread");
  }
}

EventLoop& loop() {
  // Never destroyed: see actor_server_fuzz.cpp.
  static auto& loop = []() -> EventLoop& {
    auto& made = *new EventLoop({.randomSeed = uint64_t{1}});
    setLoopCredentials(made, noCredentials());
    return made;
  }();
  return loop;
}

void checkTable(Resolver& resolver) {
  for (auto& e : resolver.resolve("").wait(loop().waitScope())) {
    KJ_IF_MAYBE(parts, parseEndpointName(e.name)) {
      check(parts->jobId == e.jobId && parts->actor == e.actor && parts->taskIndex == e.taskIndex,
            "an endpoint's parts differ from its name's");
    } else {
      check(false, "a resolver holds a bad endpoint name");
    }
    check(Address::parse(e.address).toString() == e.address, "an address not in canonical form");
  }
}

void resolverUrl(kj::StringPtr text) {
  // file: reads whatever file the text names (a fifo would never end): its parser is fed
  // directly instead (4).
  if (text.startsWith("file:")) return;
  parse([&]() {
    auto resolver = openResolver(loop(), text);
    if (text.startsWith("fixed:")) checkTable(*resolver);
  });
}

void fixedTables(kj::StringPtr text) {
  parse([&]() { checkTable(*FixedResolver::parseFile(text, "fuzz")); });
  parse([&]() { checkTable(*FixedResolver::parse(text)); });
}

void prefixes(kj::StringPtr text) {
  bool valid = kj::runCatchingExceptions([&]() { validatePrefix(text); }) == nullptr;
  if (valid) {
    check(text.size() <= MAX_PREFIX_LENGTH, "a long prefix passed");
    for (char c : text) check(c > ' ' && c < 0x7f, "a prefix with a bad byte passed");
  }
  // A job overlaps a prefix exactly when one of "<job>/" and the prefix starts with the other.
  KJ_IF_MAYBE(slash, text.findFirst('/')) {
    auto job = kj::heapString(text.slice(0, *slash));
    check(jobOverlapsPrefix(job, text), "a job does not overlap its own prefix");
  }
}

void environment(kj::StringPtr text) {
  // An environment holds no NUL bytes.
  if (strlen(text.cStr()) != text.size()) return;
  std::map<std::string, std::string> variables;
  kj::StringPtr rest = text;
  while (rest.size() > 0) {
    size_t end = rest.findFirst('\n').orDefault(rest.size());
    auto line = kj::heapString(rest.slice(0, end));
    rest = end < rest.size() ? rest.slice(end + 1) : kj::StringPtr();
    KJ_IF_MAYBE(equals, line.findFirst('=')) {
      variables[std::string(line.begin(), *equals)] = line.slice(*equals + 1).cStr();
    }
  }
  parse([&]() {
    auto job = JobContext::fromEnvironment([&](kj::StringPtr name) -> kj::Maybe<kj::StringPtr> {
      auto it = variables.find(name.cStr());
      if (it == variables.end()) return nullptr;
      return kj::StringPtr(it->second.c_str());
    });
    check(job.taskIndex < job.numTasks, "a task index not below the task count passed");
    validateJobId(job.jobId);
  });
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::fuzz;
  NoStackTraces noStackTraces;
  if (size == 0) return 0;
  auto text = kj::heapString(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (static_cast<uint8_t>(data[0] - '0') % 7) {
    case 0:
      address(text);
      break;
    case 1:
      endpointNames(text);
      break;
    case 2:
      numbers(text);
      break;
    case 3:
      resolverUrl(text);
      break;
    case 4:
      fixedTables(text);
      break;
    case 5:
      prefixes(text);
      break;
    case 6:
      environment(text);
      break;
  }
  return 0;
}
