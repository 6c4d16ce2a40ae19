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

void OnceContext::keepIn(ReplyCache& cache, ReplyCache::Entry& entry) {
  this->cache = cache;
  this->entry = entry;
}

void OnceContext::callEnded(kj::Maybe<const kj::Exception&> failure) {
  KJ_IF_MAYBE(c, cache) {
    auto& kept = KJ_ASSERT_NONNULL(entry);
    cache = nullptr;
    entry = nullptr;
    kj::Own<StoredReply> reply;
    KJ_IF_MAYBE(e, failure) {
      reply = kj::refcounted<StoredReply>(kj::cp(*e));
    } else KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                              [&]() { reply = takeReply(c->maxReplyBytes()); })) {
      // The call ran; its waiters must hear of it however its reply fared.
      reply = kj::refcounted<StoredReply>(kj::mv(*e));
    }
    c->finished(kept, kj::mv(reply));
  }
}

namespace {

// ops[0] names the envelope's `results`; the rest are the caller's, within them.
bool insideResults(kj::ArrayPtr<const capnp::PipelineOp> ops) {
  return ops.size() > 0 && ops[0].type == capnp::PipelineOp::GET_POINTER_FIELD &&
         ops[0].pointerIndex == 0;
}

}  // namespace

ReplyPipeline::~ReplyPipeline() noexcept(false) {}

kj::Own<capnp::ClientHook> ReplyPipeline::getPipelinedCap(
    kj::ArrayPtr<const capnp::PipelineOp> ops) {
  if (!insideResults(ops)) {
    return capnp::newBrokenCap("a pipelined call outside an ExactlyOnce call's results");
  }
  auto inside = ops.slice(1, ops.size());
  KJ_IF_MAYBE(r, reply) {
    return (*r)->pipelinedCap(inside);
  }
  KJ_IF_MAYBE(e, failure) {
    return capnp::newBrokenCap(kj::cp(*e));
  }
  auto paf = kj::newPromiseAndFulfiller<kj::Own<capnp::ClientHook>>();
  waiting.add(Waiting{kj::heapArray(inside), kj::mv(paf.fulfiller)});
  return capnp::newLocalPromiseClient(kj::mv(paf.promise));
}

void ReplyPipeline::resolve(kj::Own<StoredReply> r) {
  for (auto& w : waiting) w.fulfiller->fulfill(r->pipelinedCap(w.ops));
  waiting.clear();
  reply = kj::mv(r);
}

void ReplyPipeline::fail(const kj::Exception& e) {
  for (auto& w : waiting) w.fulfiller->reject(kj::cp(e));
  waiting.clear();
  failure = kj::cp(e);
}

}  // namespace troupe::actor_detail
