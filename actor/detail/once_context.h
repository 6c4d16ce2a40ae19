#pragma once
// The server side of an ExactlyOnce call (schemas/actor.capnp): the context the actor's method
// runs in, which reads the parameters inside the envelope and writes its results inside the
// envelope's results, in the message that carries them back (so that adoptBytes() works there as
// in any call), and keeps them for the reply cache once the call is done (that message, or a
// copy), so that the reply is kept whether or not the connection it came on still stands; and
// the pipeline over a kept reply.

#include <capnp/capability.h>
#include <capnp/message.h>
#include <kj/async.h>
#include <kj/refcount.h>
#include <kj/vector.h>

#include "troupe/actor/detail/actor_gate.h"
#include "troupe/actor/detail/reply_cache.h"

namespace troupe::actor_detail {

// Loop thread only.
class OnceContext final : public capnp::CallContextHook,
                          public CallEndListener,
                          public kj::Refcounted {
public:
  // `params`: the parameters inside the envelope that `outer` (the call as it arrived) carries.
  // The results go inside `outer`'s.
  OnceContext(kj::Own<capnp::CallContextHook> outer, capnp::AnyPointer::Reader params);

  capnp::AnyPointer::Reader getParams() override;
  void releaseParams() override;
  capnp::AnyPointer::Builder getResults(kj::Maybe<capnp::MessageSize> sizeHint) override;
  kj::Promise<void> tailCall(kj::Own<capnp::RequestHook>&& request) override;
  void allowCancellation() override { cancellable = true; }
  void setPipeline(kj::Own<capnp::PipelineHook>&&) override {}
  kj::Promise<capnp::AnyPointer::Pipeline> onTailCall() override { return kj::NEVER_DONE; }
  capnp::ClientHook::VoidPromiseAndPipeline directTailCall(
      kj::Own<capnp::RequestHook>&& request) override;
  kj::Own<capnp::CallContextHook> addRef() override { return kj::addRef(*this); }

  // The results the method wrote, as the reply to keep (empty results if it wrote none), or
  // StoredReply::notKept() when they are over `maxBytes`. They stay in place in the envelope's
  // results either way; large ones without capabilities are kept there, by keeping the message
  // that carries them back (retainOutgoingMessage()), and the others are copied.
  kj::Own<StoredReply> takeReply(uint64_t maxBytes);

  // Keeps the call's reply in `cache` as call `entry` there once it ends (callEnded()).
  void keepIn(ReplyCache& cache, ReplyCache::Entry& entry);
  void callEnded(kj::Maybe<const kj::Exception&> failure) override;

  // Whether the actor lets its calls be cancelled (the gate said so).
  bool cancellable = false;

private:
  kj::Own<capnp::CallContextHook> outer;
  capnp::AnyPointer::Reader params;
  bool released = false;                          // the parameters were
  kj::Maybe<capnp::AnyPointer::Builder> results;  // inside the envelope's results, once asked for
  const void* envelope = nullptr;                 // where the envelope's results are, then
  kj::Maybe<ReplyCache&> cache;  // where the reply is kept, and as which call, until it is
  kj::Maybe<ReplyCache::Entry&> entry;
};

// The pipeline of an ExactlyOnce call, whose results hold the call's own under pointer 0:
// pipelined calls on them reach the capabilities of its reply once it is there. Rather than a
// fork of the reply's promise for every call (which few ever pipeline on), whoever gets the
// reply hands it over. Loop thread only.
class ReplyPipeline final : public capnp::PipelineHook, public kj::Refcounted {
public:
  ~ReplyPipeline() noexcept(false);

  kj::Own<capnp::PipelineHook> addRef() override { return kj::addRef(*this); }
  kj::Own<capnp::ClientHook> getPipelinedCap(kj::ArrayPtr<const capnp::PipelineOp> ops) override;

  // The call's reply is `reply`; capabilities asked for earlier resolve to its.
  void resolve(kj::Own<StoredReply> reply);
  // The call failed with `e`: so do the capabilities asked for.
  void fail(const kj::Exception& e);

private:
  struct Waiting {
    kj::Array<capnp::PipelineOp> ops;  // within the call's own results
    kj::Own<kj::PromiseFulfiller<kj::Own<capnp::ClientHook>>> fulfiller;
  };
  kj::Maybe<kj::Own<StoredReply>> reply;
  kj::Maybe<kj::Exception> failure;
  kj::Vector<Waiting> waiting;
};

}  // namespace troupe::actor_detail
