#include "troupe/actor/detail/once_call.h"

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/net/limits.h"

namespace troupe::actor_detail {

namespace {

// Connections that may break under one call before it ends with MAY_HAVE_RUN.
constexpr uint32_t MAX_BREAKS = 8;
// The wait before connecting again after the second break, doubling after each further one.
constexpr kj::Duration FIRST_BACKOFF = 10 * kj::MILLISECONDS;
constexpr kj::Duration MAX_BACKOFF = 1 * kj::SECONDS;

// Whether `e` says the connection broke (or could not be made), rather than the server or the
// actor answering with an error.
// (The server answers an ExactlyOnce call's errors inside its results, so that a plain
// DISCONNECTED from the peer is its Cap'n Proto aborting the connection, as it does when its
// RpcSystem goes away; OnceCall::failed() tells answers apart.)
bool connectionBroke(const kj::Exception& e) {
  auto code = errorCode(e);
  if (code != ErrorCode::DISCONNECTED && code != ErrorCode::UNREACHABLE) return false;
  // An answer from troupe on the server carries its code's tag.
  return !fromPeer(e) || raisedByActor(e);
}

const uint ONCE_BRAND = 0;

// One request of a call, sent in its envelope; then what keeps the envelope's response while
// the results inside it are read.
class OnceRequest final : public capnp::RequestHook,
                          public capnp::ResponseHook,
                          public kj::Refcounted {
public:
  OnceRequest(capnp::Request<capnp::AnyPointer, capnp::AnyPointer>&& envelope, OnceCall& call,
              uint64_t seq)
      : envelope(kj::mv(envelope)), call(kj::addRef(call)), seq(seq) {}

  capnp::RemotePromise<capnp::AnyPointer> send() override {
    call->sending(envelope.asReader().targetSize().wordCount * sizeof(capnp::word));
    auto outer = envelope.send();
    auto pipeline = outer.getPointerField(0);
    kj::Promise<capnp::Response<capnp::AnyPointer>> promise = kj::mv(outer);
    auto answered = promise.then(
        [self = kj::addRef(*this)](capnp::Response<capnp::AnyPointer>&& r) mutable {
          auto results = r.getAs<schema::ExactlyOnce::CallResults>();
          if (results.hasError()) {
            // As Cap'n Proto rebuilds an exception its peer sent.
            auto error = results.getError();
            auto type = static_cast<kj::Exception::Type>(
                kj::min(error.getType(), uint8_t(kj::Exception::Type::UNIMPLEMENTED)));
            kj::Exception e(type, "(remote)", 0,
                            kj::str("remote exception: ", error.getDescription()));
            self->call->answered(self->seq, e);
            kj::throwFatalException(kj::mv(e));
          }
          self->call->answered(self->seq);
          // The results keep the envelope's response, not the call: it ends (and its id is
          // acknowledged) when its promise does, however long the caller keeps them.
          self->call = nullptr;
          auto inside = results.getResults();
          self->response = kj::mv(r);
          return capnp::Response<capnp::AnyPointer>(inside, kj::mv(self));
        },
        // The call and the id, not this request (whose response only results keep).
        [call = kj::addRef(*call),
         seq = seq](kj::Exception&& e) mutable -> capnp::Response<capnp::AnyPointer> {
          // An error of the lookup (the request never reached the actor) is not an answer.
          if (!connectionBroke(e) && call->reachedActor()) call->answered(seq, e);
          kj::throwFatalException(kj::mv(e));
        });
    return capnp::RemotePromise<capnp::AnyPointer>(kj::mv(answered), kj::mv(pipeline));
  }

  kj::Promise<void> sendStreaming() override { return send().ignoreResult(); }

  const void* getBrand() override { return &ONCE_BRAND; }

private:
  capnp::Request<capnp::AnyPointer, capnp::AnyPointer> envelope;  // until sent
  kj::Maybe<capnp::Response<capnp::AnyPointer>> response;         // once answered
  kj::Own<OnceCall> call;                                         // until answered
  uint64_t seq;
};

}  // namespace

capnp::Request<capnp::AnyPointer, capnp::AnyPointer> OnceCall::newCall(
    uint64_t interfaceId, uint16_t methodId, kj::Maybe<capnp::MessageSize> sizeHint) {
  uint64_t seq = nextRequest();
  KJ_IF_MAYBE(hint, sizeHint) {
    // The envelope's own fields and acknowledgements.
    hint->wordCount += 16 + 64;
  }
  auto envelope = target->newCall(capnp::typeId<schema::ExactlyOnce>(), 0, sizeHint);
  auto params = envelope.initAs<schema::ExactlyOnce::CallParams>();
  fill(params, seq);
  params.setInterfaceId(interfaceId);
  params.setMethodId(methodId);
  auto inside = params.getParams();
  return capnp::Request<capnp::AnyPointer, capnp::AnyPointer>(
      inside, kj::refcounted<OnceRequest>(kj::mv(envelope), *this, seq));
}

capnp::ClientHook::VoidPromiseAndPipeline OnceCall::call(
    uint64_t interfaceId, uint16_t methodId, kj::Own<capnp::CallContextHook>&& context) {
  // Only requests made here (newCall) carry an id.
  return target->call(interfaceId, methodId, kj::mv(context));
}

const void* OnceCall::getBrand() { return &ONCE_BRAND; }

// ------------------------------------------------------------------------------------------------

OnceCall::OnceCall(ActorRefState& ref) : ref(kj::addRef(ref)) {}

OnceCall::~OnceCall() noexcept(false) {
  auto& s = *ref;
  bool sameConnection = delivered && attemptEpoch == s.channel->epoch() &&
                        s.actorEpoch == attemptEpoch && s.answeredEpoch == attemptEpoch;
  for (uint32_t i = 0; i < requests; ++i) {
    auto& r = request(i);
    if (!r.answered && sameConnection) {
      KJ_IF_MAYBE(actor, s.actor) {
        auto cancel = actor->castAs<schema::ExactlyOnce>().cancelRequest();
        cancel.setCallerId(s.caller.id());
        cancel.setSeq(r.seq);
        s.tasks.add(cancel.send().ignoreResult());
      }
    }
    s.caller.release(r.seq);
  }
}

uint64_t OnceCall::nextRequest() {
  if (nextIndex == requests) {
    Sent sent{ref->caller.allocate()};
    if (requests == 0) {
      first = sent;
    } else {
      more.add(sent);
    }
    ++requests;
  }
  return request(nextIndex++).seq;
}

void OnceCall::fill(schema::ExactlyOnce::CallParams::Builder params, uint64_t seq) {
  params.setCallerId(ref->caller.id());
  params.setSeq(seq);
  params.setRetry(mayHaveRun);
  params.setIncarnation(incarnation);
  ref->caller.fillAcks(params);
}

void OnceCall::sending(uint64_t bytes) { largestRequest = kj::max(largestRequest, bytes); }

void OnceCall::answered(uint64_t seq) {
  for (uint32_t i = 0; i < requests; ++i) {
    if (request(i).seq == seq) request(i).answered = true;
  }
}

void OnceCall::answered(uint64_t seq, const kj::Exception& e) {
  answered(seq);
  answers.add(kj::str(e.getDescription()));
}

bool OnceCall::isAnswer(const kj::Exception& e) const {
  for (auto& a : answers) {
    if (a == e.getDescription()) return true;
  }
  return false;
}

kj::Exception OnceCall::restarted() const {
  auto& s = *ref;
  return makeError(ErrorCode::MAY_HAVE_RUN,
                   kj::str("the connection to '", s.actorName, "' at ",
                           s.channel->address().toString(),
                           " broke after the call was sent, and the server has restarted since "
                           "(incarnation ",
                           incarnation, ", now ", KJ_ASSERT_NONNULL(s.incarnation),
                           "): the call may have run there"));
}

void OnceCall::delivering() {
  delivered = true;
  if (!mayHaveRun) incarnation = KJ_ASSERT_NONNULL(ref->incarnation);
}

capnp::Capability::Client OnceCall::attempt() {
  auto& s = *ref;
  nextIndex = 0;
  delivered = false;
  s.actorCapability();
  attemptEpoch = s.channel->epoch();
  auto ready = [this]() -> capnp::Capability::Client {
    auto& s = *ref;
    if (mayHaveRun && KJ_ASSERT_NONNULL(s.incarnation) != incarnation) {
      return capnp::Capability::Client(capnp::newBrokenCap(restarted()));
    }
    delivering();
    return KJ_ASSERT_NONNULL(s.actor);
  };
  if (s.answeredEpoch == attemptEpoch && s.actorEpoch == attemptEpoch) {
    target = capnp::ClientHook::from(ready());
  } else {
    // Requests wait here until the lookup is answered: only then does the server know this
    // caller, and this call know which incarnation it talks to.
    target = capnp::ClientHook::from(capnp::Capability::Client(s.lookedUp().then(kj::mv(ready))));
  }
  return capnp::Capability::Client(kj::addRef(*this));
}

kj::Promise<void> OnceCall::failed(kj::Exception&& e) {
  auto& s = *ref;
  if (isAnswer(e)) return kj::mv(e);
  if (!connectionBroke(e)) {
    // What the server said about the call stands; what it said about the lookup of a retry (it
    // drains, it no longer hosts the actor) says nothing of whether the call ran.
    if (!mayHaveRun || delivered || errorCode(e) == ErrorCode::MAY_HAVE_RUN) return kj::mv(e);
    return makeError(
        ErrorCode::MAY_HAVE_RUN,
        kj::str("the connection to '", s.actorName, "' at ", s.channel->address().toString(),
                " broke after the call was sent, and connecting again failed: ", errorMessage(e),
                "; the call may have run there"));
  }
  s.callFailed(e, attemptEpoch);
  KJ_IF_MAYBE(limit, peerMessageLimit(e)) {
    // The server closed the connection for a message over its limit: if it was this call's, the
    // call never ran there and never will.
    if (largestRequest > *limit) {
      return makeError(ErrorCode::MESSAGE_TOO_LARGE,
                       kj::str("the call's request of at least ", largestRequest,
                               " bytes is over the limit of ", *limit, " bytes of '", s.actorName,
                               "' at ", s.channel->address().toString(),
                               " (maxMessageBytes), which closed the connection; it did not run"));
    }
  }
  if (delivered) mayHaveRun = true;
  if (!mayHaveRun) {
    return makeError(ErrorCode::UNREACHABLE,
                     kj::str("the connection to '", s.actorName, "' at ",
                             s.channel->address().toString(),
                             " broke before the call was sent; it did not run: ", errorMessage(e)));
  }
  if (++breaks > MAX_BREAKS) {
    return makeError(
        ErrorCode::MAY_HAVE_RUN,
        kj::str("the connection to '", s.actorName, "' at ", s.channel->address().toString(),
                " broke while the call was in flight, and ", breaks - 1,
                " tries to send it again failed; it may have run there: ", errorMessage(e)));
  }
  if (breaks == 1) return kj::READY_NOW;
  auto wait = FIRST_BACKOFF * (uint64_t(1) << kj::min(breaks - 2, 10u));
  return s.channel->loop().timer().afterDelay(kj::min(wait, MAX_BACKOFF));
}

}  // namespace troupe::actor_detail
