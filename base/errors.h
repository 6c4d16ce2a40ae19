#pragma once
// Every error troupe reports, in one place.
//
// troupe's errors are kj::Exceptions, so they cross the wire the way Cap'n Proto carries any
// exception: as a kj::Exception::Type plus a description. The type carries the retry decision
// (as in Cap'n Proto):
//
//   DISCONNECTED   the connection or endpoint is gone: re-resolve; the call may or may not have run
//   OVERLOADED     temporarily unable: back off and retry
//   FAILED         the actor raised (or the caller broke a contract): never retried
//   UNIMPLEMENTED  no such method or interface at that actor
//
// troupe's own failures refine those kinds. Their description starts with "troupe.<code>: " and
// errorCode() recovers the code from any exception, including one that crossed the wire, so a
// caller tells them apart by comparing codes, never by reading prose. The table says, per code,
// whether the call may have run (callNeverRan() is its negation) and whether sending it again can
// help (mayRetry(); "if idempotent": only when running it twice is harmless, which a pool asks of
// the caller):
//
//   code               type           may have run?  retry?          raised when
//   FAILED             FAILED         yes            no              the actor (or the caller)
//                                                                    failed; no troupe code
//   OVERLOADED         OVERLOADED     yes            if idempotent   temporarily unable
//   DISCONNECTED       DISCONNECTED   yes            if idempotent   the connection broke
//   UNIMPLEMENTED      UNIMPLEMENTED  yes            no              no such method or interface
//   ACTOR_NOT_FOUND    FAILED         no             yes             no actor hosted under that
//                                                                    name (another member may)
//   DRAINING           OVERLOADED     no             yes             the server drains: go
//                                                                    elsewhere
//   UNREACHABLE        DISCONNECTED   no             yes             no connection could be made
//   DEADLINE_EXCEEDED  OVERLOADED     yes            if idempotent   the call's deadline passed
//   INVALID_ARGUMENT   FAILED         no             no              a bad name, address or option
//   MESSAGE_TOO_LARGE  FAILED         no             no              a message over the size limit
//   ADDRESS_IN_USE     FAILED         (no call)      no              listen() on an address in use
//   JOB_ENDED          FAILED         no             no              the job has ended: its
//                                                                    endpoints are gone and cannot
//                                                                    register
//   NAME_TAKEN         FAILED         (no call)      no              another live replica holds
//                                                                    the name with the same or a
//                                                                    newer incarnation
//   LEASE_LOST         DISCONNECTED   (no call)      yes             a registration expired or was
//                                                                    replaced: register again
//   NO_ENDPOINTS       OVERLOADED     no             yes             a pool has no ready member
//   MAY_HAVE_RUN       DISCONNECTED   yes            no              a call not marked idempotent
//                                                                    may have reached an actor and
//                                                                    no one can tell whether it
//                                                                    ran: its server died or
//                                                                    restarted, dropped its reply
//                                                                    (ReplyCacheOptions), keeps
//                                                                    none, or its connection broke
//                                                                    9 times (README, "Errors and
//                                                                    retries")
//   JOB_ALREADY_EXISTS FAILED         (no call)      no              a job of that name is still
//                                                                    live
//   UNAUTHENTICATED    FAILED         no             no              the connection presented no
//                                                                    cluster credential, or a
//                                                                    wrong one (SECURITY.md)
//   PERMISSION_DENIED  FAILED         no             no              the caller lacks the job
//                                                                    credential the call needs
//   QUEUE_FULL         OVERLOADED     no             yes             the actor's queue of calls
//                                                                    waiting to run was full
//                                                                    (ActorOptions::maxQueued):
//                                                                    go elsewhere or later
//   BLOB_REFUSED       FAILED         no             no              a receiver refused a blob
//                                                                    before any byte moved
//                                                                    (blob.h): no such receiver,
//                                                                    too big, a version it has
//   BLOB_ABORTED       DISCONNECTED   yes            yes             a blob transfer was given up
//                                                                    part-way: aborted by its
//                                                                    sender, superseded by a newer
//                                                                    version, a chunk failed its
//                                                                    checksum, or no chunk within
//                                                                    the receiver's idle timeout
//                                                                    (a member that stalls is
//                                                                    DEADLINE_EXCEEDED)
//
// An exception without a troupe code maps to the code of its type (FAILED, OVERLOADED,
// DISCONNECTED, UNIMPLEMENTED), for which callNeverRan() is false: even UNIMPLEMENTED may come
// from an actor that ran part-way and then called something missing.
//
// An exception an actor raised reaches the caller with its message and its kj type (FAILED for a
// failed KJ_REQUIRE or a std::exception; whatever type the actor chose otherwise), and
// raisedByActor() says it came from the actor rather than from troupe or the connection. Pools
// never retry such a call. An actor that passes on a troupe error of its own (say UNREACHABLE
// from a call it made) does not make its caller's call look unreachable: the server prefixes
// such messages with "raised by actor '<name>': ", and only a code troupe itself attached to
// this call counts.
//
// A call not marked idempotent that an ActorRef or a pool sends is not left in doubt by a broken
// connection: it is sent again to the same server with the same id, which runs it once and
// answers a retry from the reply it kept (ActorRefOptions::exactlyOnce, ReplyCacheOptions). So
// such a call ends with DISCONNECTED only when the caller turned that off, and with MAY_HAVE_RUN
// only when the server that got it cannot answer any more (the table's row).

#include <string>
#include <type_traits>

#include <kj/exception.h>
#include <kj/string.h>

namespace troupe {

enum class ErrorCode {
  // Cap'n Proto's kinds, for exceptions troupe did not classify further.
  FAILED,
  OVERLOADED,
  DISCONNECTED,
  UNIMPLEMENTED,
  // troupe's own.
  ACTOR_NOT_FOUND,
  DRAINING,
  UNREACHABLE,
  DEADLINE_EXCEEDED,
  INVALID_ARGUMENT,
  MESSAGE_TOO_LARGE,
  ADDRESS_IN_USE,
  JOB_ENDED,
  NAME_TAKEN,
  LEASE_LOST,
  NO_ENDPOINTS,
  MAY_HAVE_RUN,
  JOB_ALREADY_EXISTS,
  UNAUTHENTICATED,
  PERMISSION_DENIED,
  QUEUE_FULL,
  BLOB_REFUSED,
  BLOB_ABORTED,
};

// The code of any exception: troupe's own when its description carries one (also after it
// crossed the wire), else the code of its kj type.
ErrorCode errorCode(const kj::Exception& exception);

// "actor_not_found", "draining", ... ; for the four kj kinds "failed", "overloaded", ...
kj::StringPtr errorCodeName(ErrorCode code);

// The kj type every exception with this code carries.
kj::Exception::Type errorType(ErrorCode code);

// True when the code guarantees the call never reached the actor, so even a non-idempotent call
// may be sent again (elsewhere or later).
bool callNeverRan(ErrorCode code);

// True when sending the call again (to another member, or later) can succeed: for a code whose
// call may have run, only if the call is idempotent. False for what the actor or the caller got
// wrong. An exception the actor raised itself (raisedByActor()) is never retried, whatever its
// code.
bool mayRetry(ErrorCode code);

// True when `exception` came back from the server and was raised by the actor's own code (not
// by troupe on the server, and not by the connection or this process).
bool raisedByActor(const kj::Exception& exception);

// True when `exception` came from the other end of a connection (Cap'n Proto marks what a peer
// sends), not from this process.
bool fromPeer(const kj::Exception& exception);

// What a server sends its caller for `exception`, thrown by the method of the actor named
// `actorName`: the same, except that a troupe error the actor passes on (from a call of its own,
// say) is renamed "raised by actor '<name>': ...", so that the caller does not read it as what
// troupe said about the caller's own call.
kj::Exception asRaisedByActor(kj::Exception&& exception, kj::StringPtr actorName);

// Builds troupe's exception for `code`: type errorType(code), description
// "troupe.<name>: <message>".
kj::Exception makeError(ErrorCode code, kj::StringPtr message, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE());

// The description of `exception` without troupe's "troupe.<code>: " tag at its start (or
// "remote exception: troupe.<code>: ", as a peer's troupe error arrives), for quoting it in
// another message.
kj::StringPtr errorMessage(const kj::Exception& exception);

// `exception` with "<where>: " put in front of its message, for saying which member or address
// it concerns. Its type stays, and so do its troupe code and whether the actor raised it:
// errorCode() and raisedByActor() answer for the result as they do for `exception`.
kj::Exception withContext(const kj::Exception& exception, kj::StringPtr where);

// errorMessage(exception) without the "<where>: " withContext() put in, for a line that names
// `where` already; errorMessage(exception) when there is none.
kj::String messageWithout(const kj::Exception& exception, kj::StringPtr where);

// For error messages: `text` with control characters and non-ASCII bytes escaped ("\x0a") and
// cut after 160 bytes ("..."), so that bad input quoted in a message stays readable.
kj::String printable(kj::ArrayPtr<const char> text);
template <typename S, typename = std::enable_if_t<std::is_same_v<S, std::string>>>
kj::String printable(const S& text) {  // all of a std::string, NUL bytes included
  return printable(kj::arrayPtr(text.data(), text.size()));
}

// A kj exception for a failed system call `what` (with `detail`, such as an address, when given)
// that set `error` (an errno value): DISCONNECTED for the errors that mean the peer is gone or
// unreachable, FAILED otherwise. Not a troupe error code: it is the transport's failure.
kj::Exception syscallException(const char* what, int error, kj::StringPtr detail = nullptr);

// Throws makeError(code, message).
[[noreturn]] void throwError(ErrorCode code, kj::StringPtr message,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE());

}  // namespace troupe
