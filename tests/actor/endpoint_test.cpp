// endpoint.h: name rules, endpoint names and their parsing, and the Cap'n Proto round trip.

#include "troupe/actor/endpoint.h"

#include <string>

#include <capnp/message.h>
#include <gtest/gtest.h>

#include "troupe/base/errors.h"

namespace troupe {
namespace {

std::string str(kj::StringPtr s) { return std::string(s.begin(), s.size()); }

kj::StringPtr ptr(const std::string& s) { return kj::StringPtr(s.c_str(), s.size()); }

// The description of the INVALID_ARGUMENT `f` throws; fails the test when it throws nothing or
// something else.
template <typename F>
std::string invalidArgument(F&& f) {
  try {
    f();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << str(e.getDescription());
    return str(e.getDescription());
  }
  ADD_FAILURE() << "no exception";
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---- names ----

TEST(EndpointNameRules, AcceptsLettersDigitsAndPunctuation) {
  for (const char* name : {"a", "Z", "7", "job-1", "my_actor", "v1.2.3", "a-b_c.d", "0-", "x.",
                           "A_", "123456", "Mixed-Case.Name_9"}) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(validateJobId(name));
    EXPECT_NO_THROW(validateActorName(name));
  }
}

TEST(EndpointNameRules, EmptyIsRejected) {
  auto job = invalidArgument([] { validateJobId(""); });
  EXPECT_TRUE(contains(job, "troupe.invalid_argument: ")) << job;
  EXPECT_TRUE(contains(job, "job id")) << job;
  EXPECT_TRUE(contains(job, "empty")) << job;
  auto actor = invalidArgument([] { validateActorName(""); });
  EXPECT_TRUE(contains(actor, "actor name")) << actor;
  EXPECT_TRUE(contains(actor, "empty")) << actor;
}

TEST(EndpointNameRules, LengthLimitIsInclusive) {
  ASSERT_EQ(MAX_NAME_LENGTH, 128u);
  std::string atLimit(MAX_NAME_LENGTH, 'a');
  EXPECT_NO_THROW(validateJobId(ptr(atLimit)));
  EXPECT_NO_THROW(validateActorName(ptr(atLimit)));

  std::string over(MAX_NAME_LENGTH + 1, 'a');
  auto job = invalidArgument([&] { validateJobId(ptr(over)); });
  EXPECT_TRUE(contains(job, "129 bytes")) << job;
  EXPECT_TRUE(contains(job, "128")) << job;
  auto actor = invalidArgument([&] { validateActorName(ptr(over)); });
  EXPECT_TRUE(contains(actor, "129 bytes")) << actor;
}

TEST(EndpointNameRules, VeryLongNameIsCutInTheMessage) {
  std::string huge(10000, 'q');
  auto msg = invalidArgument([&] { validateActorName(ptr(huge)); });
  EXPECT_TRUE(contains(msg, "10000 bytes")) << msg;
  EXPECT_LT(msg.size(), 1000u);
}

TEST(EndpointNameRules, MustStartWithLetterOrDigit) {
  for (const char* name : {".a", "_a", "-a", "/a", " a"}) {
    SCOPED_TRACE(name);
    auto job = invalidArgument([&] { validateJobId(name); });
    EXPECT_TRUE(contains(job, "must start with a letter or digit")) << job;
    auto actor = invalidArgument([&] { validateActorName(name); });
    EXPECT_TRUE(contains(actor, "must start with a letter or digit")) << actor;
  }
}

TEST(EndpointNameRules, SlashIsRejectedWithItsPosition) {
  auto job = invalidArgument([] { validateJobId("job/1"); });
  EXPECT_TRUE(contains(job, "'job/1'")) << job;
  EXPECT_TRUE(contains(job, "'/'")) << job;
  EXPECT_TRUE(contains(job, "byte 3")) << job;
  auto actor = invalidArgument([] { validateActorName("calc/x"); });
  EXPECT_TRUE(contains(actor, "'/'")) << actor;
  EXPECT_TRUE(contains(actor, "byte 4")) << actor;
}

TEST(EndpointNameRules, SpaceAndOtherPunctuationAreRejected) {
  auto space = invalidArgument([] { validateActorName("my actor"); });
  EXPECT_TRUE(contains(space, "' '")) << space;
  EXPECT_TRUE(contains(space, "byte 2")) << space;
  for (const char* name : {"a:b", "a@b", "a+b", "a*b", "a\\b", "a'b", "a,b", "a~b"}) {
    SCOPED_TRACE(name);
    invalidArgument([&] { validateJobId(name); });
    invalidArgument([&] { validateActorName(name); });
  }
}

TEST(EndpointNameRules, ControlCharactersAreRejectedAndEscaped) {
  for (char c : {'\x01', '\t', '\n', '\x1f', '\x7f'}) {
    SCOPED_TRACE(static_cast<int>(c));
    std::string name = std::string("ab") + c + "cd";
    auto msg = invalidArgument([&] { validateActorName(ptr(name)); });
    EXPECT_TRUE(contains(msg, "control character")) << msg;
    EXPECT_TRUE(contains(msg, "byte 2")) << msg;
    // The raw byte never reaches the message; it is written as \x..
    EXPECT_FALSE(contains(msg, std::string(1, c))) << msg;
    EXPECT_TRUE(contains(msg, "ab\\x")) << msg;
  }
}

TEST(EndpointNameRules, NonAsciiIsRejected) {
  invalidArgument([] { validateActorName("caf\xc3\xa9"); });
}

// ---- endpointName ----

TEST(EndpointName, JoinsJobActorAndIndex) {
  EXPECT_EQ(endpointName("job-1", "calc", 3), "job-1/calc-3");
  EXPECT_EQ(endpointName("local", "my-actor", 0), "local/my-actor-0");
  EXPECT_EQ(endpointName("j", "a", 4294967295u), "j/a-4294967295");
}

TEST(EndpointName, ValidatesBothParts) {
  auto job = invalidArgument([] { endpointName("bad job", "calc", 0); });
  EXPECT_TRUE(contains(job, "job id")) << job;
  auto actor = invalidArgument([] { endpointName("job", "bad/actor", 0); });
  EXPECT_TRUE(contains(actor, "actor name")) << actor;
  invalidArgument([] { endpointName("", "calc", 0); });
  invalidArgument([] { endpointName("job", "", 0); });
}

// ---- parseEndpointName ----

TEST(ParseEndpointName, SplitsAValidName) {
  auto parts = KJ_ASSERT_NONNULL(parseEndpointName("job-1/calc-3"));
  EXPECT_EQ(parts.jobId, "job-1");
  EXPECT_EQ(parts.actor, "calc");
  EXPECT_EQ(parts.taskIndex, 3u);
}

TEST(ParseEndpointName, IndexFollowsTheLastDash) {
  auto parts = KJ_ASSERT_NONNULL(parseEndpointName("j/my-fancy-actor-12"));
  EXPECT_EQ(parts.jobId, "j");
  EXPECT_EQ(parts.actor, "my-fancy-actor");
  EXPECT_EQ(parts.taskIndex, 12u);

  // An actor name that itself ends in '-'.
  auto trailing = KJ_ASSERT_NONNULL(parseEndpointName("j/a--7"));
  EXPECT_EQ(trailing.actor, "a-");
  EXPECT_EQ(trailing.taskIndex, 7u);
}

TEST(ParseEndpointName, ZeroIndex) {
  auto parts = KJ_ASSERT_NONNULL(parseEndpointName("j/a-0"));
  EXPECT_EQ(parts.taskIndex, 0u);
}

TEST(ParseEndpointName, InvertsEndpointName) {
  struct Case {
    const char* job;
    const char* actor;
    uint32_t index;
  };
  for (auto c :
       {Case{"local", "calc", 0}, Case{"job-1", "my-actor", 17}, Case{"a.b_c", "x-", 999999999u},
        Case{"j", "a", 1000000000u}, Case{"j", "a", 4294967295u}}) {
    auto name = endpointName(c.job, c.actor, c.index);
    SCOPED_TRACE(name);
    KJ_IF_MAYBE(parts, parseEndpointName(ptr(name))) {
      EXPECT_EQ(parts->jobId, c.job);
      EXPECT_EQ(parts->actor, c.actor);
      EXPECT_EQ(parts->taskIndex, c.index);
    } else {
      ADD_FAILURE() << "parseEndpointName rejected what endpointName built";
    }
  }
}

TEST(ParseEndpointName, RejectsMissingSlash) {
  EXPECT_TRUE(parseEndpointName("calc-3") == nullptr);
  EXPECT_TRUE(parseEndpointName("") == nullptr);
}

TEST(ParseEndpointName, RejectsMissingOrBadIndex) {
  EXPECT_TRUE(parseEndpointName("j/calc") == nullptr);    // no dash
  EXPECT_TRUE(parseEndpointName("j/calc-") == nullptr);   // empty
  EXPECT_TRUE(parseEndpointName("j/calc-x") == nullptr);  // not a number
  EXPECT_TRUE(parseEndpointName("j/calc-3x") == nullptr);
  EXPECT_TRUE(parseEndpointName("j/calc-+3") == nullptr);
  EXPECT_TRUE(parseEndpointName("j/calc- 3") == nullptr);
  EXPECT_TRUE(parseEndpointName("j/calc-3 ") == nullptr);
  EXPECT_TRUE(parseEndpointName("j/calc-01") == nullptr);  // leading zero
  EXPECT_TRUE(parseEndpointName("j/calc-00") == nullptr);
}

TEST(ParseEndpointName, RejectsIndexOverflow) {
  EXPECT_TRUE(parseEndpointName("j/a-4294967296") == nullptr);  // UINT32_MAX + 1
  EXPECT_TRUE(parseEndpointName("j/a-9999999999") == nullptr);
  EXPECT_TRUE(parseEndpointName("j/a-99999999999999999999") == nullptr);
}

TEST(ParseEndpointName, RejectsInvalidJobOrActor) {
  EXPECT_TRUE(parseEndpointName("/calc-3") == nullptr);     // empty job
  EXPECT_TRUE(parseEndpointName("j/-3") == nullptr);        // empty actor
  EXPECT_TRUE(parseEndpointName("_j/calc-3") == nullptr);   // job starts badly
  EXPECT_TRUE(parseEndpointName("j/.calc-3") == nullptr);   // actor starts badly
  EXPECT_TRUE(parseEndpointName("j/a/b-3") == nullptr);     // a second slash
  EXPECT_TRUE(parseEndpointName("j b/calc-3") == nullptr);  // space in the job
  EXPECT_TRUE(parseEndpointName("j/ca\tlc-3") == nullptr);  // control char in the actor
  EXPECT_TRUE(parseEndpointName(ptr(std::string(129, 'j') + "/a-1")) == nullptr);
  EXPECT_TRUE(parseEndpointName(ptr("j/" + std::string(129, 'a') + "-1")) == nullptr);
  EXPECT_TRUE(parseEndpointName(ptr(std::string(128, 'j') + "/" + std::string(128, 'a') + "-1")) !=
              nullptr);
}

// ---- EndpointState ----

TEST(EndpointStateTest, ToString) {
  EXPECT_EQ(str(toString(EndpointState::STARTING)), "starting");
  EXPECT_EQ(str(toString(EndpointState::READY)), "ready");
  EXPECT_EQ(str(toString(EndpointState::DRAINING)), "draining");
}

TEST(EndpointStateTest, CapnpConversionRoundTrips) {
  EXPECT_EQ(toCapnp(EndpointState::STARTING), schema::EndpointState::STARTING);
  EXPECT_EQ(toCapnp(EndpointState::READY), schema::EndpointState::READY);
  EXPECT_EQ(toCapnp(EndpointState::DRAINING), schema::EndpointState::DRAINING);
  for (auto s : {EndpointState::STARTING, EndpointState::READY, EndpointState::DRAINING}) {
    EXPECT_EQ(fromCapnp(toCapnp(s)), s);
  }
}

TEST(EndpointStateTest, UnknownWireStateIsNotServing) {
  // A state a newer peer added.
  EXPECT_EQ(fromCapnp(static_cast<schema::EndpointState>(42)), EndpointState::STARTING);
}

// ---- Endpoint capnp round trip ----

Endpoint sampleEndpoint() {
  Endpoint e;
  e.name = "job-1/calc-3";
  e.address = "tcp://10.0.0.5:7000";
  e.jobId = "job-1";
  e.actor = "calc";
  e.taskIndex = 3;
  e.incarnation = 0xfedcba9876543210ull;
  e.state = EndpointState::DRAINING;
  e.metadata = {{"zone", "eu-west"}, {"gpu", "a100"}, {"empty", ""}};
  return e;
}

TEST(EndpointCapnp, RoundTripKeepsEveryField) {
  auto original = sampleEndpoint();
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<schema::Endpoint>();
  original.toCapnp(builder);

  auto reader = builder.asReader();
  EXPECT_EQ(reader.getName(), "job-1/calc-3");
  EXPECT_EQ(reader.getAddress(), "tcp://10.0.0.5:7000");
  EXPECT_EQ(reader.getJobId(), "job-1");
  EXPECT_EQ(reader.getActor(), "calc");
  EXPECT_EQ(reader.getTaskIndex(), 3u);
  EXPECT_EQ(reader.getIncarnation(), 0xfedcba9876543210ull);
  EXPECT_EQ(reader.getState(), schema::EndpointState::DRAINING);
  ASSERT_EQ(reader.getMetadata().size(), 3u);

  auto back = Endpoint::fromCapnp(reader);
  EXPECT_EQ(back, original);
  EXPECT_EQ(back.metadata.at("zone"), "eu-west");
  EXPECT_EQ(back.metadata.at("gpu"), "a100");
  EXPECT_EQ(back.metadata.at("empty"), "");
}

TEST(EndpointCapnp, RoundTripOfEachState) {
  for (auto s : {EndpointState::STARTING, EndpointState::READY, EndpointState::DRAINING}) {
    auto original = sampleEndpoint();
    original.state = s;
    capnp::MallocMessageBuilder message;
    auto builder = message.initRoot<schema::Endpoint>();
    original.toCapnp(builder);
    EXPECT_EQ(Endpoint::fromCapnp(builder.asReader()).state, s);
  }
}

TEST(EndpointCapnp, DefaultEndpointRoundTrips) {
  Endpoint original;
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<schema::Endpoint>();
  original.toCapnp(builder);
  auto back = Endpoint::fromCapnp(builder.asReader());
  EXPECT_EQ(back, original);
  EXPECT_TRUE(back.metadata.empty());
  EXPECT_EQ(back.state, EndpointState::STARTING);
}

TEST(EndpointCapnp, Utf8MetadataSurvives) {
  Endpoint original = sampleEndpoint();
  original.metadata = {{"caf\xc3\xa9", "\xe2\x9c\x93"}, {"spaces", "a b  c"}};
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<schema::Endpoint>();
  original.toCapnp(builder);
  auto back = Endpoint::fromCapnp(builder.asReader());
  EXPECT_EQ(back.metadata.at("caf\xc3\xa9"), "\xe2\x9c\x93");
  EXPECT_EQ(back, original);
}

TEST(EndpointCapnp, EmptyMessageReadsAsDefaults) {
  // An Endpoint struct nobody filled in (an older peer, say) reads as the default value.
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<schema::Endpoint>();
  EXPECT_EQ(Endpoint::fromCapnp(builder.asReader()), Endpoint{});
}

TEST(EndpointValue, CopiesAreIndependent) {
  auto a = sampleEndpoint();
  auto b = a;
  b.metadata["zone"] = "us-east";
  b.taskIndex = 4;
  EXPECT_EQ(a.metadata.at("zone"), "eu-west");
  EXPECT_EQ(a.taskIndex, 3u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace troupe
