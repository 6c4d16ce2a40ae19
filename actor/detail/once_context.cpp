#include "troupe/actor/detail/once_context.h"

#include <kj/debug.h>

#include "troupe/net/bytes.h"
#include "troupe/schemas/actor.capnp.h"

namespace troupe::actor_detail {

namespace {

// Results at least this large are kept in the message that carried them back: their copy would
// cost a pass over them, and the message holds little more than they do (its large segments
// come from the buffer cache, sized to what they hold). Smaller ones are copied, which keeps
// less than the message's first segment (SMALL_SEGMENT_WORDS, buffer_cache.h).
constexpr uint64_t IN_PLACE_MIN_BYTES = CACHED_BUFFER_MIN_BYTES;

}  // namespace

OnceContext::OnceContext(kj::Own<capnp::CallContextHook> outer, capnp::AnyPointer::Reader params)
    : outer(kj::mv(outer)), params(params) {}

capnp::AnyPointer::Reader OnceContext::getParams() {
  KJ_REQUIRE(!released, "the call's parameters were released already");
  return params;
}

void OnceContext::releaseParams() {
  if (!released) outer->releaseParams();
  released = true;
}

capnp::AnyPointer::Builder OnceContext::getResults(kj::Maybe<capnp::MessageSize> sizeHint) {
  KJ_IF_MAYBE(r, results) {
    return *r;
  }
  KJ_IF_MAYBE(hint, sizeHint) {
    hint->wordCount += 8;  // the envelope's results around them
  }
  auto envelope = outer->getResults(sizeHint).initAs<schema::ExactlyOnce::CallResults>();
  // A struct's data section begins where it lies in its message (empty here, its pointers follow).
  this->envelope = capnp::AnyStruct::Builder(schema::ExactlyOnce::CallResults::Builder(envelope))
                       .getDataSection()
                       .begin();
  auto inside = envelope.initResults();
  results = inside;
  return inside;
}

kj::Promise<void> OnceContext::tailCall(kj::Own<capnp::RequestHook>&& request) {
  // The reply must be kept here, so the tail call's results are copied rather than forwarded.
  return request->send().then(
      [self = kj::addRef(*this)](capnp::Response<capnp::AnyPointer>&& r) mutable {
        self->getResults(r.targetSize()).set(r);
      });
}

capnp::ClientHook::VoidPromiseAndPipeline OnceContext::directTailCall(
    kj::Own<capnp::RequestHook>&& request) {
  return {tailCall(kj::mv(request)),
          capnp::newBrokenPipeline(KJ_EXCEPTION(FAILED, "no pipelining on a tail call here"))};
}

kj::Own<StoredReply> OnceContext::takeReply(uint64_t maxBytes) {
  KJ_IF_MAYBE(r, results) {
    auto reader = r->asReader();
    auto size = reader.targetSize();
    auto bytes = size.wordCount * sizeof(capnp::word);
    if (bytes > maxBytes) return StoredReply::notKept(bytes);
    if (size.capCount == 0 && bytes >= IN_PLACE_MIN_BYTES) {
      KJ_IF_MAYBE(message, retainOutgoingMessage(envelope)) {
        return kj::refcounted<StoredReply>(reader, kj::mv(message->holder), message->bytes);
      }
    }
    return StoredReply::copyOf(reader);
  }
  return StoredReply::copyOf(capnp::AnyPointer::Reader());
}

namespace {

class ReplyPipeline final : public capnp::PipelineHook, public kj::Refcounted {
public:
  explicit ReplyPipeline(kj::Own<StoredReply> reply) : reply(kj::mv(reply)) {}

  kj::Own<capnp::PipelineHook> addRef() override { return kj::addRef(*this); }

  kj::Own<capnp::ClientHook> getPipelinedCap(kj::ArrayPtr<const capnp::PipelineOp> ops) override {
    // ops[0] names the envelope's `results`; the rest are the caller's, within them.
    if (ops.size() == 0 || ops[0].type != capnp::PipelineOp::GET_POINTER_FIELD ||
        ops[0].pointerIndex != 0) {
      return capnp::newBrokenCap("a pipelined call outside an ExactlyOnce call's results");
    }
    return reply->pipelinedCap(ops.slice(1, ops.size()));
  }

private:
  kj::Own<StoredReply> reply;
};

}  // namespace

kj::Own<capnp::PipelineHook> replyPipeline(kj::Own<StoredReply> reply) {
  return kj::refcounted<ReplyPipeline>(kj::mv(reply));
}

}  // namespace troupe::actor_detail
