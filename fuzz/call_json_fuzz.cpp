// The parameters of `troupe call` read from JSON text against a method's schema (JsonCall in
// tools/troupe/dynamic_actor.h, CallJson in call_json.h), with the schema loaded the way the
// command loads what a server sends: into a capnp::SchemaLoader. The input is a method name of
// call_params.capnp's MoreCallParams, a newline, and the JSON text.
//
// Refusals (INVALID_ARGUMENT, saying what is wrong) are fine, as `troupe call` reads the text and
// as `troupe call --partial` does. Checked: every other exception is a bug, and parameters that
// were read print as JSON (as `troupe call` prints results) that reads back to parameters that
// print the same.

#include <capnp/message.h>
#include <capnp/schema-loader.h>
#include <kj/async.h>

#include "troupe/base/errors.h"
#include "call_params.capnp.h"
#include "fuzz/fuzz_support.h"
#include "tools/troupe/call_json.h"
#include "tools/troupe/dynamic_actor.h"

namespace troupe::fuzz {
namespace {

struct Target {
  kj::EventLoop loop;  // for the null capability DynamicActor holds
  kj::WaitScope ws{loop};
  capnp::SchemaLoader loader;
  DynamicActor actor;
  cli::CallJson codec;

  Target() : actor{"params", load(loader), capnp::Capability::Client(nullptr)} {}

  static capnp::InterfaceSchema load(capnp::SchemaLoader& loader) {
    loader.loadCompiledTypeAndDependencies<MoreCallParams>();
    return loader.get(capnp::typeId<MoreCallParams>()).asInterface();
  }
};

// What `troupe call` makes of the parameters it read: one line of JSON.
kj::String printed(const Target& target, capnp::InterfaceSchema::Method method,
                   kj::StringPtr json) {
  capnp::MallocMessageBuilder message;
  auto params = message.initRoot<capnp::DynamicStruct>(method.getParamType());
  // Printing leaves out null pointers, so what it printed reads back as --partial reads it.
  target.codec.decodeParams(json, params, "params.method", cli::MissingParams::DEFAULT);
  return target.codec.encodeResults(params.asReader());
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  NoStackTraces noStackTraces;
  static auto& target = *new Target;
  auto input = kj::arrayPtr(reinterpret_cast<const char*>(data), size);
  size_t newline = 0;
  while (newline < size && input[newline] != '\n') ++newline;
  if (newline == size) return 0;
  auto method = kj::heapString(input.slice(0, newline));
  auto json = kj::heapString(input.slice(newline + 1, size));

  auto read = [&](cli::MissingParams missing) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                       [&]() { cli::JsonCall(target.actor, method, json, missing); })) {
      if (errorCode(*e) != ErrorCode::INVALID_ARGUMENT) {
        fprintf(stderr, "fuzz: %s\n", e->getDescription().cStr());
        check(false, "JSON parameters failed with something other than INVALID_ARGUMENT");
      }
      return false;
    }
    return true;
  };
  read(cli::MissingParams::REFUSE);
  if (!read(cli::MissingParams::DEFAULT)) return 0;
  auto found = KJ_ASSERT_NONNULL(target.actor.schema.findMethodByName(method));
  kj::String once;
  kj::String twice;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                once = printed(target, found, json);
                twice = printed(target, found, once);
              })) {
    fprintf(stderr, "fuzz: %s\n", e->getDescription().cStr());
    check(false, "parameters printed as JSON do not read back");
  }
  check(once == twice, "parameters printed as JSON read back different");
  return 0;
}
