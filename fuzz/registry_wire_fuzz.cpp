// The registry's wire values read from arbitrary Cap'n Proto messages. The first input byte
// picks the type of the root (its distance from '0', modulo 10: the seeds start with the digit);
// the rest is a message in the standard framing (segment table, then segments), read with limits
// like a connection's:
//
//   0  Endpoint                   5  Registry.RegisterParams (the endpoint)
//   1  JobStatus                  6  Registry.ResolveParams (the prefix)
//   2  WatchEvent                 7  Registry.WatchParams (the prefix)
//   3  Watcher.EventsParams       8  Registry.SetJobStatusParams (the status)
//   4  Registry.ResolveResults    9  Registry.JobStatusParams (the job id)
//
// Each is converted (registry_wire.h, Endpoint::fromCapnp) and validated (endpoint names,
// addresses, prefixes, job ids) as the registry and its clients do. Refusing a value is fine (an
// exception for a NUL in a text, a malformed pointer, a bad name). Checked: whatever is accepted
// converts back to the same wire value and reads back equal, and what the validators accept
// they accept again in canonical form.

#include <string.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "troupe/actor/endpoint.h"
#include "troupe/net/address.h"
#include "troupe/resolver/registry_wire.h"
#include "troupe/resolver/resolver.h"
#include "fuzz/fuzz_support.h"

namespace troupe::fuzz {
namespace {

// Reading limits: a registry's messages are small, and the fuzzer's inputs smaller.
capnp::ReaderOptions readerOptions() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 64 * 1024;
  options.nestingLimit = 64;
  return options;
}

bool sameEvent(const WatchEvent& a, const WatchEvent& b) {
  return a.type == b.type && a.endpoint == b.endpoint && a.job == b.job;
}

// Runs `fn`; an exception is a refused input, the expected end of most of them.
template <typename Fn>
void refusable(Fn&& fn) {
  kj::runCatchingExceptions(kj::fwd<Fn>(fn));
}

void validateEndpoint(const Endpoint& e) {
  // As the registry takes a registration: its name's parts, its address in canonical form.
  KJ_IF_MAYBE(parts, parseEndpointName(e.name)) {
    check(endpointName(parts->jobId, parts->actor, parts->taskIndex) == e.name,
          "an endpoint name does not rebuild from its parts");
  }
  refusable([&]() {
    auto canonical = Address::parse(e.address).toString();
    check(Address::parse(canonical).toString() == canonical,
          "an address's canonical form is not canonical");
  });
}

void roundTrip(const Endpoint& e) {
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<schema::Endpoint>();
  e.toCapnp(builder);
  check(Endpoint::fromCapnp(builder.asReader()) == e, "an endpoint does not survive a round trip");
  validateEndpoint(e);
}

void readEndpoint(schema::Endpoint::Reader reader) {
  refusable([&]() { roundTrip(Endpoint::fromCapnp(reader)); });
}

void readJobStatus(schema::JobStatus::Reader reader) {
  refusable([&]() {
    auto status = fromCapnp(reader);
    capnp::MallocMessageBuilder message;
    auto builder = message.initRoot<schema::JobStatus>();
    toCapnp(status, builder);
    check(fromCapnp(builder.asReader()) == status, "a job status does not survive a round trip");
    refusable([&]() { validateJobId(status.jobId); });
  });
}

void readWatchEvent(schema::WatchEvent::Reader reader) {
  refusable([&]() {
    KJ_IF_MAYBE(event, fromCapnp(reader)) {
      capnp::MallocMessageBuilder message;
      auto builder = message.initRoot<schema::WatchEvent>();
      toCapnp(*event, builder);
      auto again = fromCapnp(builder.asReader());
      check(again != nullptr && sameEvent(KJ_ASSERT_NONNULL(again), *event),
            "a watch event does not survive a round trip");
      if (event->type != WatchEvent::Type::SYNCED && event->type != WatchEvent::Type::JOB_ENDED) {
        validateEndpoint(event->endpoint);
      }
    } else {
      check(reader.which() > schema::WatchEvent::JOB_ENDED, "a known event kind was dropped");
    }
  });
}

void readPrefix(capnp::Text::Reader prefix) {
  refusable([&]() {
    validatePrefix(prefix);
    check(strlen(prefix.cStr()) == prefix.size(), "a prefix with a NUL byte passed");
  });
}

void readRoot(capnp::MessageReader& message, uint8_t type) {
  switch (type) {
    case 0:
      return readEndpoint(message.getRoot<schema::Endpoint>());
    case 1:
      return readJobStatus(message.getRoot<schema::JobStatus>());
    case 2:
      return readWatchEvent(message.getRoot<schema::WatchEvent>());
    case 3:
      for (auto e : message.getRoot<schema::Watcher::EventsParams>().getEvents()) readWatchEvent(e);
      return;
    case 4:
      for (auto e : message.getRoot<schema::Registry::ResolveResults>().getEndpoints()) {
        readEndpoint(e);
      }
      return;
    case 5:
      return readEndpoint(message.getRoot<schema::Registry::RegisterParams>().getEndpoint());
    case 6:
      return readPrefix(message.getRoot<schema::Registry::ResolveParams>().getPrefix());
    case 7:
      return readPrefix(message.getRoot<schema::Registry::WatchParams>().getPrefix());
    case 8:
      return readJobStatus(message.getRoot<schema::Registry::SetJobStatusParams>().getStatus());
    case 9:
      return refusable([&]() {
        validateJobId(message.getRoot<schema::Registry::JobStatusParams>().getJobId());
      });
  }
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::fuzz;
  NoStackTraces noStackTraces;
  if (size < 2) return 0;
  uint8_t type = static_cast<uint8_t>(data[0] - '0') % 10;
  // Cap'n Proto reads words in place: copy the message to word-aligned memory, zero-padded.
  size_t bytes = size - 1;
  auto words = kj::heapArray<capnp::word>((bytes + sizeof(capnp::word) - 1) / sizeof(capnp::word));
  memset(words.begin(), 0, words.asBytes().size());
  memcpy(words.begin(), data + 1, bytes);
  refusable([&]() {
    capnp::FlatArrayMessageReader message(words, readerOptions());
    readRoot(message, type);
  });
  return 0;
}
