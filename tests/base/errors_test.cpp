// errors.h: the code table, makeError()'s description format and errorCode()'s recovery of a
// code from any exception's description.

#include "troupe/base/errors.h"

#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <kj/io.h>

#include "troupe/schemas/actor.capnp.h"

namespace troupe {
namespace {

using Type = kj::Exception::Type;

std::string str(kj::StringPtr s) { return std::string(s.begin(), s.size()); }

kj::Exception plain(Type type, kj::StringPtr description) {
  return kj::Exception(type, __FILE__, __LINE__, kj::heapString(description));
}

// One row of the table at the top of errors.h.
struct Row {
  ErrorCode code;
  const char* name;
  Type type;
};

constexpr Row TABLE[] = {
    {ErrorCode::FAILED, "failed", Type::FAILED},
    {ErrorCode::OVERLOADED, "overloaded", Type::OVERLOADED},
    {ErrorCode::DISCONNECTED, "disconnected", Type::DISCONNECTED},
    {ErrorCode::UNIMPLEMENTED, "unimplemented", Type::UNIMPLEMENTED},
    {ErrorCode::ACTOR_NOT_FOUND, "actor_not_found", Type::FAILED},
    {ErrorCode::DRAINING, "draining", Type::OVERLOADED},
    {ErrorCode::UNREACHABLE, "unreachable", Type::DISCONNECTED},
    {ErrorCode::DEADLINE_EXCEEDED, "deadline_exceeded", Type::OVERLOADED},
    {ErrorCode::INVALID_ARGUMENT, "invalid_argument", Type::FAILED},
    {ErrorCode::MESSAGE_TOO_LARGE, "message_too_large", Type::FAILED},
    {ErrorCode::ADDRESS_IN_USE, "address_in_use", Type::FAILED},
    {ErrorCode::JOB_ENDED, "job_ended", Type::FAILED},
    {ErrorCode::NAME_TAKEN, "name_taken", Type::FAILED},
    {ErrorCode::LEASE_LOST, "lease_lost", Type::DISCONNECTED},
    {ErrorCode::NO_ENDPOINTS, "no_endpoints", Type::OVERLOADED},
    {ErrorCode::MAY_HAVE_RUN, "may_have_run", Type::DISCONNECTED},
    {ErrorCode::JOB_ALREADY_EXISTS, "job_already_exists", Type::FAILED},
    {ErrorCode::UNAUTHENTICATED, "unauthenticated", Type::FAILED},
    {ErrorCode::PERMISSION_DENIED, "permission_denied", Type::FAILED},
    {ErrorCode::QUEUE_FULL, "queue_full", Type::OVERLOADED},
    {ErrorCode::BLOB_REFUSED, "blob_refused", Type::FAILED},
    {ErrorCode::BLOB_ABORTED, "blob_aborted", Type::DISCONNECTED},
};

TEST(ErrorsTest, EveryCodeHasTheDocumentedNameAndType) {
  for (auto& row : TABLE) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(str(errorCodeName(row.code)), row.name);
    EXPECT_EQ(errorType(row.code), row.type);
  }
}

TEST(ErrorsTest, CallNeverRanFollowsTheTable) {
  // "may the call have run?" = "no" in the table.
  EXPECT_TRUE(callNeverRan(ErrorCode::ACTOR_NOT_FOUND));
  EXPECT_TRUE(callNeverRan(ErrorCode::DRAINING));
  EXPECT_TRUE(callNeverRan(ErrorCode::UNREACHABLE));
  EXPECT_TRUE(callNeverRan(ErrorCode::INVALID_ARGUMENT));
  EXPECT_TRUE(callNeverRan(ErrorCode::JOB_ENDED));
  EXPECT_TRUE(callNeverRan(ErrorCode::NO_ENDPOINTS));
  EXPECT_FALSE(callNeverRan(ErrorCode::MAY_HAVE_RUN));
  EXPECT_TRUE(callNeverRan(ErrorCode::MESSAGE_TOO_LARGE));
  EXPECT_TRUE(callNeverRan(ErrorCode::UNAUTHENTICATED));
  EXPECT_TRUE(callNeverRan(ErrorCode::PERMISSION_DENIED));
  EXPECT_TRUE(callNeverRan(ErrorCode::QUEUE_FULL));
  EXPECT_TRUE(callNeverRan(ErrorCode::BLOB_REFUSED));
  EXPECT_FALSE(callNeverRan(ErrorCode::BLOB_ABORTED));
  // "yes": the deadline may pass while the actor runs the call.
  EXPECT_FALSE(callNeverRan(ErrorCode::DEADLINE_EXCEEDED));
  // Unclassified kinds promise nothing: DISCONNECTED "may or may not have run", FAILED may be the
  // actor's own exception, OVERLOADED may come from anywhere.
  EXPECT_FALSE(callNeverRan(ErrorCode::FAILED));
  EXPECT_FALSE(callNeverRan(ErrorCode::OVERLOADED));
  EXPECT_FALSE(callNeverRan(ErrorCode::DISCONNECTED));
}

TEST(ErrorsTest, MayRetryFollowsTheTable) {
  // Retrying cannot help what the actor or the caller got wrong, nor a call a pool already gave
  // up on.
  for (auto code :
       {ErrorCode::FAILED, ErrorCode::UNIMPLEMENTED, ErrorCode::INVALID_ARGUMENT,
        ErrorCode::MESSAGE_TOO_LARGE, ErrorCode::ADDRESS_IN_USE, ErrorCode::JOB_ENDED,
        ErrorCode::NAME_TAKEN, ErrorCode::MAY_HAVE_RUN, ErrorCode::JOB_ALREADY_EXISTS,
        ErrorCode::UNAUTHENTICATED, ErrorCode::PERMISSION_DENIED, ErrorCode::BLOB_REFUSED}) {
    EXPECT_FALSE(mayRetry(code)) << str(errorCodeName(code));
  }
  for (auto code : {ErrorCode::OVERLOADED, ErrorCode::DISCONNECTED, ErrorCode::ACTOR_NOT_FOUND,
                    ErrorCode::DRAINING, ErrorCode::UNREACHABLE, ErrorCode::DEADLINE_EXCEEDED,
                    ErrorCode::LEASE_LOST, ErrorCode::NO_ENDPOINTS, ErrorCode::QUEUE_FULL,
                    ErrorCode::BLOB_ABORTED}) {
    EXPECT_TRUE(mayRetry(code)) << str(errorCodeName(code));
  }
}

TEST(ErrorsTest, AsRaisedByActorRenamesOnlyTroupesOwnErrors) {
  auto passedOn = asRaisedByActor(makeError(ErrorCode::UNREACHABLE, "cannot connect"), "calc");
  EXPECT_EQ(str(passedOn.getDescription()),
            "raised by actor 'calc': troupe.unreachable: cannot connect");
  EXPECT_EQ(passedOn.getType(), Type::DISCONNECTED);
  auto own = asRaisedByActor(plain(Type::FAILED, "divide by zero"), "calc");
  EXPECT_EQ(str(own.getDescription()), "divide by zero");
  EXPECT_TRUE(fromPeer(plain(Type::FAILED, "remote exception: x")));
  EXPECT_FALSE(fromPeer(plain(Type::FAILED, "x")));
}

TEST(ErrorsTest, MakeErrorBuildsTypeAndPrefixedDescription) {
  for (auto& row : TABLE) {
    SCOPED_TRACE(row.name);
    auto e = makeError(row.code, "something went wrong");
    EXPECT_EQ(e.getType(), row.type);
    EXPECT_EQ(str(e.getDescription()),
              std::string("troupe.") + row.name + ": something went wrong");
    EXPECT_EQ(errorCode(e), row.code);
  }
}

TEST(ErrorsTest, MakeErrorWithEmptyMessageStillCarriesTheCode) {
  auto e = makeError(ErrorCode::DRAINING, "");
  EXPECT_EQ(str(e.getDescription()), "troupe.draining: ");
  EXPECT_EQ(errorCode(e), ErrorCode::DRAINING);
}

TEST(ErrorsTest, MakeErrorRecordsTheCallersFileAndLine) {
  int line = __LINE__ + 1;
  auto e = makeError(ErrorCode::UNREACHABLE, "no route");
  EXPECT_TRUE(kj::StringPtr(e.getFile()).endsWith("errors_test.cpp")) << e.getFile();
  EXPECT_EQ(e.getLine(), line);

  auto explicitly = makeError(ErrorCode::UNREACHABLE, "no route", "somewhere.cpp", 17);
  EXPECT_EQ(std::string(explicitly.getFile()), "somewhere.cpp");
  EXPECT_EQ(explicitly.getLine(), 17);
}

TEST(ErrorsTest, ThrowErrorThrowsWhatMakeErrorBuilds) {
  int line = 0;
  try {
    line = __LINE__ + 1;
    throwError(ErrorCode::ACTOR_NOT_FOUND, "no actor 'calc'");
    ADD_FAILURE() << "throwError returned";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(e.getType(), Type::FAILED);
    EXPECT_EQ(str(e.getDescription()), "troupe.actor_not_found: no actor 'calc'");
    EXPECT_EQ(errorCode(e), ErrorCode::ACTOR_NOT_FOUND);
    EXPECT_TRUE(kj::StringPtr(e.getFile()).endsWith("errors_test.cpp")) << e.getFile();
    EXPECT_EQ(e.getLine(), line);
  }
}

TEST(ErrorsTest, CodeSurvivesCapnpRemoteExceptionPrefix) {
  // What the client sees after the error crossed the wire: same type, "remote exception: " added.
  for (auto& row : TABLE) {
    SCOPED_TRACE(row.name);
    auto original = makeError(row.code, "detail");
    auto remote = plain(original.getType(),
                        kj::str("remote exception: ", original.getDescription()));
    EXPECT_EQ(errorCode(remote), row.code);
  }
  // Passed on by an actor from a call of its own (a second prefix): not about this call.
  auto forwarded = plain(Type::OVERLOADED,
                         "remote exception: remote exception: troupe.draining: x");
  EXPECT_EQ(errorCode(forwarded), ErrorCode::OVERLOADED);
  EXPECT_TRUE(raisedByActor(forwarded));
}

TEST(ErrorsTest, ErrorMessageDropsTheTagOnly) {
  EXPECT_EQ(str(errorMessage(makeError(ErrorCode::DRAINING, "going away"))), "going away");
  EXPECT_EQ(str(errorMessage(plain(Type::FAILED, "divide by zero"))), "divide by zero");
  EXPECT_EQ(str(errorMessage(plain(Type::FAILED, "remote exception: troupe.draining: x"))),
            "remote exception: troupe.draining: x");
  // A peer's troupe error, with its code's type, is quoted without the tags.
  EXPECT_EQ(str(errorMessage(plain(Type::OVERLOADED, "remote exception: troupe.draining: x"))),
            "x");
}

TEST(ErrorsTest, ATagWhoseTypeDiffersIsNotACode) {
  EXPECT_EQ(errorCode(plain(Type::FAILED, "troupe.draining: bye")), ErrorCode::FAILED);
  EXPECT_EQ(errorCode(plain(Type::DISCONNECTED, "remote exception: troupe.deadline_exceeded: 5s")),
            ErrorCode::DISCONNECTED);
}

TEST(ErrorsTest, RaisedByActorTellsTheActorsExceptionsFromTroupes) {
  // From the server, untagged: the actor's own.
  EXPECT_TRUE(raisedByActor(plain(Type::FAILED, "remote exception: divide by zero")));
  EXPECT_TRUE(raisedByActor(plain(Type::OVERLOADED, "remote exception: queue full")));
  // An actor passing on a troupe error of its own, as the server rewrites it.
  EXPECT_TRUE(raisedByActor(plain(
      Type::DISCONNECTED, "remote exception: raised by actor 'calc': troupe.unreachable: x")));
  // troupe's own, from the server or from this process.
  EXPECT_FALSE(raisedByActor(plain(Type::OVERLOADED, "remote exception: troupe.draining: x")));
  EXPECT_FALSE(raisedByActor(makeError(ErrorCode::UNREACHABLE, "cannot connect")));
  EXPECT_FALSE(raisedByActor(plain(Type::DISCONNECTED, "Peer disconnected.")));
}

TEST(ErrorsTest, WithContextNamesWhereAndKeepsCodeTypeAndOrigin) {
  struct Case {
    kj::Exception original;
    const char* expected;
  };
  Case cases[] = {
      {makeError(ErrorCode::UNREACHABLE, "cannot connect"),
       "troupe.unreachable: m-0 (tcp://h:1): cannot connect"},
      {plain(Type::OVERLOADED, "remote exception: troupe.draining: bye"),
       "remote exception: troupe.draining: m-0 (tcp://h:1): bye"},
      {plain(Type::FAILED, "remote exception: divide by zero"),
       "remote exception: m-0 (tcp://h:1): divide by zero"},
      {plain(Type::DISCONNECTED, "Peer disconnected."), "m-0 (tcp://h:1): Peer disconnected."},
  };
  for (auto& c : cases) {
    auto wrapped = withContext(c.original, "m-0 (tcp://h:1)");
    EXPECT_EQ(str(wrapped.getDescription()), c.expected);
    EXPECT_EQ(wrapped.getType(), c.original.getType());
    EXPECT_EQ(errorCode(wrapped), errorCode(c.original)) << c.expected;
    EXPECT_EQ(raisedByActor(wrapped), raisedByActor(c.original)) << c.expected;
    EXPECT_EQ(str(messageWithout(wrapped, "m-0 (tcp://h:1)")), str(errorMessage(c.original)));
  }
  EXPECT_EQ(str(messageWithout(makeError(ErrorCode::UNREACHABLE, "x"), "m-1")), "x");
}

TEST(ErrorsTest, CodeWithNothingAfterTheColon) {
  EXPECT_EQ(errorCode(plain(Type::OVERLOADED, "troupe.draining:")), ErrorCode::DRAINING);
}

TEST(ErrorsTest, PlainExceptionsFallBackToTheirKjType) {
  EXPECT_EQ(errorCode(plain(Type::FAILED, "divide by zero")), ErrorCode::FAILED);
  EXPECT_EQ(errorCode(plain(Type::OVERLOADED, "busy")), ErrorCode::OVERLOADED);
  EXPECT_EQ(errorCode(plain(Type::DISCONNECTED, "Peer disconnected.")), ErrorCode::DISCONNECTED);
  EXPECT_EQ(errorCode(plain(Type::UNIMPLEMENTED, "Method not implemented.")),
            ErrorCode::UNIMPLEMENTED);
  EXPECT_EQ(errorCode(plain(Type::FAILED, "")), ErrorCode::FAILED);
  EXPECT_EQ(errorCode(plain(Type::DISCONNECTED, "remote exception: actor crashed")),
            ErrorCode::DISCONNECTED);
}

TEST(ErrorsTest, LookalikesAreNotCodes) {
  // Glued to a preceding word.
  EXPECT_EQ(errorCode(plain(Type::FAILED, "xtroupe.draining: no")), ErrorCode::FAILED);
  EXPECT_EQ(errorCode(plain(Type::FAILED, "remote exception: xtroupe.draining: no")),
            ErrorCode::FAILED);
  // No colon after the name.
  EXPECT_EQ(errorCode(plain(Type::FAILED, "troupe.draining")), ErrorCode::FAILED);
  EXPECT_EQ(errorCode(plain(Type::FAILED, "troupe.draining now")), ErrorCode::FAILED);
  EXPECT_EQ(errorCode(plain(Type::FAILED, "remote exception: troupe.draining")), ErrorCode::FAILED);
  // A longer name that starts with a code's name.
  EXPECT_EQ(errorCode(plain(Type::FAILED, "troupe.draining_soon: no")), ErrorCode::FAILED);
  // An unknown code.
  EXPECT_EQ(errorCode(plain(Type::DISCONNECTED, "troupe.no_such_code: x")),
            ErrorCode::DISCONNECTED);
  // Just the prefix.
  EXPECT_EQ(errorCode(plain(Type::OVERLOADED, "troupe.")), ErrorCode::OVERLOADED);
  EXPECT_EQ(errorCode(plain(Type::OVERLOADED, "troupe.:")), ErrorCode::OVERLOADED);
  // Case matters.
  EXPECT_EQ(errorCode(plain(Type::FAILED, "Troupe.draining: x")), ErrorCode::FAILED);
  EXPECT_EQ(errorCode(plain(Type::FAILED, "troupe.DRAINING: x")), ErrorCode::FAILED);
}

TEST(ErrorsTest, CapnpSizeLimitMessagesAreMessageTooLarge) {
  // What Cap'n Proto 0.9.2's KJ_REQUIREs produce on the sending side (rpc-twoparty.c++) ...
  auto sending = plain(Type::FAILED,
                       "expected size < limit; Trying to send Cap'n Proto message larger than our "
                       "single-message size limit. The other side probably won't accept it "
                       "(assuming its traversalLimitInWords matches ours) and would abort the "
                       "connection, so I won't send it.; size = 8388700");
  EXPECT_EQ(errorCode(sending), ErrorCode::MESSAGE_TOO_LARGE);
  // ... and on the receiving side (serialize.c++), also after crossing the wire.
  auto receiving = plain(Type::FAILED,
                         "expected totalWords <= options.traversalLimitInWords; Message is too "
                         "large.  To increase the limit on the receiving end, see "
                         "capnp::ReaderOptions.");
  EXPECT_EQ(errorCode(receiving), ErrorCode::MESSAGE_TOO_LARGE);
  // troupe's own framing reports a receiver's refusal with its tag; Cap'n Proto's text coming
  // back from a server is an actor's business.
  auto remote = plain(Type::DISCONNECTED,
                      kj::str("remote exception: ", receiving.getDescription()));
  EXPECT_EQ(errorCode(remote), ErrorCode::DISCONNECTED);
}

TEST(ErrorsTest, RealCapnpReaderSizeLimitIsMessageTooLarge) {
  // Serialize a message, then read it back with a traversal limit below its size: Cap'n Proto
  // itself raises the "Message is too large" error.
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<schema::Endpoint>();
  root.setName(std::string(1000, 'n'));
  kj::VectorOutputStream out;
  capnp::writeMessage(out, builder);
  kj::ArrayInputStream in(out.getArray());
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 8;
  try {
    capnp::InputStreamMessageReader reader(in, options);
    ADD_FAILURE() << "reading an oversized message succeeded";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::MESSAGE_TOO_LARGE) << str(e.getDescription());
  }
}

TEST(ErrorsTest, SizeLimitTextDoesNotOverrideATroupeCode) {
  EXPECT_EQ(errorCode(plain(Type::OVERLOADED, "troupe.draining: Message is too large")),
            ErrorCode::DRAINING);
}

TEST(ErrorsTest, UnrelatedTooLargeTextIsNotMessageTooLarge) {
  EXPECT_EQ(errorCode(plain(Type::FAILED, "value is too large")), ErrorCode::FAILED);
  EXPECT_EQ(errorCode(plain(Type::FAILED, "message is too large")), ErrorCode::FAILED);
}

}  // namespace
}  // namespace troupe
