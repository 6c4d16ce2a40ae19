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

// Loop thread only. Held by ActorRefBase::OnceHandle and by the capabilities its attempts use.
class OnceCall final : public kj::Refcounted {
public:
  explicit OnceCall(ActorRefState& ref);
  // Acknowledges the call's replies (with the caller's next call), and asks the server to cancel
  // requests still unanswered (the caller gave up on them).
  ~OnceCall() noexcept(false);
  KJ_DISALLOW_COPY(OnceCall);

  // The capability the next attempt calls: the actor, on the current connection once its lookup
  // was answered, with every request made on it wrapped in an envelope.
  capnp::Capability::Client attempt();

  // The attempt failed with `e`. Resolves when the next attempt should be made; rejects with what
  // the call ends with: `e` itself for anything but a broken connection, UNREACHABLE when nothing
  // left this process, MAY_HAVE_RUN when the server restarted or too many connections broke.
  kj::Promise<void> failed(kj::Exception&& e);

  // For the envelope: the id of the attempt's next request.
  uint64_t nextRequest();
  // Fills the envelope of request `seq`.
  void fill(schema::ExactlyOnce::CallParams::Builder params, uint64_t seq);
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

  // The attempt's target is known: calls made on it now leave for the server.
  void delivering();
  kj::Exception restarted() const;
  // Whether `e` is an answer the server sent (answered()), not the connection breaking.
  bool isAnswer(const kj::Exception& e) const;

  kj::Own<ActorRefState> ref;
  kj::Vector<Sent> requests;  // by the order the call's function makes them, kept across attempts
  uint32_t nextIndex = 0;     // within the current attempt
  uint64_t attemptEpoch = 0;  // the connection of the current attempt
  bool delivered = false;     // the current attempt's requests left for the server
  bool mayHaveRun = false;    // an earlier attempt's requests did: what follows are retries
  uint64_t incarnation = 0;   // of the server the first delivered attempt went to
  uint32_t breaks = 0;        // connections that broke under this call
  kj::Vector<kj::String> answers;  // descriptions of the errors the server answered with
  uint64_t largestRequest = 0;     // bytes of the largest request sent, at least
};

// The ExactlyOnce capability of `call` over `target` (the actor's capability).
capnp::Capability::Client onceClient(OnceCall& call, capnp::Capability::Client target);

}  // namespace troupe::actor_detail
