#pragma once
// The client side of ExactlyOnce calls (schemas/actor.capnp): one call of an ActorRef, sent so
// that it runs once while the server that got it lives. Each request the call's function makes
// goes inside an ExactlyOnce envelope carrying the call's id; when the connection breaks after a
// request may have left, the call connects again to the same address and sends it again with the
// same id, and the server answers from what it kept rather than running it twice. When the
// server restarted (another incarnation) or can no longer tell, the call ends with MAY_HAVE_RUN.

#include <cstdint>

#include <capnp/capability.h>
#include <kj/async.h>
#include <kj/refcount.h>
#include <kj/vector.h>

#include "troupe/actor/detail/actor_ref_state.h"

namespace troupe::actor_detail {

// Loop thread only. Held by ActorRefBase::OnceHandle, by its requests until they are answered,
// and by the capabilities given to the call's function. It is itself the capability every
// attempt calls (a ClientHook): requests made on it go inside envelopes, to the actor on the
// current attempt's connection (a capability kept from an earlier attempt reaches the current
// one).
class OnceCall final : public kj::Refcounted, public capnp::ClientHook {
public:
  explicit OnceCall(ActorRefState& ref);
  // Acknowledges the call's replies (with the caller's next call), and asks the server to cancel
  // requests still unanswered (the caller gave up on them).
  ~OnceCall() noexcept(false);
  KJ_DISALLOW_COPY(OnceCall);

  // The capability the next attempt calls: this call, over the actor on the current connection
  // once its lookup was answered.
  capnp::Capability::Client attempt();

  // capnp::ClientHook: a request made here goes in an envelope with its id; a call relayed
  // through here goes as it is.
  capnp::Request<capnp::AnyPointer, capnp::AnyPointer> newCall(
      uint64_t interfaceId, uint16_t methodId, kj::Maybe<capnp::MessageSize> sizeHint) override;
  VoidPromiseAndPipeline call(uint64_t interfaceId, uint16_t methodId,
                              kj::Own<capnp::CallContextHook>&& context) override;
  kj::Maybe<capnp::ClientHook&> getResolved() override { return nullptr; }
  kj::Maybe<kj::Promise<kj::Own<capnp::ClientHook>>> whenMoreResolved() override { return nullptr; }
  kj::Own<capnp::ClientHook> addRef() override { return kj::addRef(*this); }
  const void* getBrand() override;
  kj::Maybe<int> getFd() override { return nullptr; }

  // The attempt failed with `e`. Resolves when the next attempt should be made; rejects with what
  // the call ends with: `e` itself for anything but a broken connection, UNREACHABLE when nothing
  // left this process, MAY_HAVE_RUN when the server restarted or too many connections broke.
  kj::Promise<void> failed(kj::Exception&& e);

  // A request whose message holds at least `bytes` leaves now.
  void sending(uint64_t bytes);
  // Whether the current attempt's lookup was answered, so that its requests went to the actor.
  bool reachedActor() const { return delivered; }
  // Request `seq` got its answer: results, or the error `e` the server sent.
  void answered(uint64_t seq);
  void answered(uint64_t seq, const kj::Exception& e);

private:
  struct Sent {
    uint64_t seq;
    bool answered = false;
  };

  // The id of the attempt's next request.
  uint64_t nextRequest();
  // Fills the envelope of request `seq`.
  void fill(schema::ExactlyOnce::CallParams::Builder params, uint64_t seq);
  // The request made `index`th by the call's function (the first is kept here: most calls make
  // one).
  Sent& request(uint32_t index) { return index == 0 ? first : more[index - 1]; }

  // The attempt's target is known: calls made on it now leave for the server.
  void delivering();
  kj::Exception restarted() const;
  // Whether `e` is an answer the server sent (answered()), not the connection breaking.
  bool isAnswer(const kj::Exception& e) const;

  kj::Own<ActorRefState> ref;
  kj::Own<capnp::ClientHook> target;  // of the current attempt: the actor's capability
  // The requests, by the order the call's function makes them, kept across attempts.
  Sent first = {0};
  kj::Vector<Sent> more;
  uint32_t requests = 0;
  uint32_t nextIndex = 0;          // within the current attempt
  uint64_t attemptEpoch = 0;       // the connection of the current attempt
  bool delivered = false;          // the current attempt's requests left for the server
  bool mayHaveRun = false;         // an earlier attempt's requests did: what follows are retries
  uint64_t incarnation = 0;        // of the server the first delivered attempt went to
  uint32_t breaks = 0;             // connections that broke under this call
  kj::Vector<kj::String> answers;  // descriptions of the errors the server answered with
  uint64_t largestRequest = 0;     // bytes of the largest request sent, at least
};

}  // namespace troupe::actor_detail
