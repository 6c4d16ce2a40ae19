// address.h: parsing, canonical text and the kj form of listen/connect addresses.

#include "troupe/net/address.h"

#include <string>

#include <gtest/gtest.h>

#include "troupe/base/errors.h"

namespace troupe {
namespace {

std::string str(kj::StringPtr s) { return std::string(s.begin(), s.size()); }

kj::StringPtr ptr(const std::string& s) { return kj::StringPtr(s.c_str(), s.size()); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The description of the INVALID_ARGUMENT Address::parse(text) throws; fails the test when it
// throws nothing or something else.
std::string invalidArgument(kj::StringPtr text) {
  try {
    auto a = Address::parse(text);
    ADD_FAILURE() << "parsed '" << str(text) << "' as " << a.toString();
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << str(e.getDescription());
    return str(e.getDescription());
  }
  return "";
}

// ---- TCP ----

TEST(AddressTest, ParsesTcpUrl) {
  auto a = Address::parse("tcp://example.com:7000");
  EXPECT_EQ(a.kind, Address::Kind::TCP);
  EXPECT_EQ(a.host, "example.com");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(a.path, "");
  EXPECT_EQ(a.toString(), "tcp://example.com:7000");
  EXPECT_EQ(str(a.toKjAddress()), "example.com:7000");
}

TEST(AddressTest, ParsesBareHostPortAsTcp) {
  auto a = Address::parse("127.0.0.1:8080");
  EXPECT_EQ(a.kind, Address::Kind::TCP);
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 8080);
  EXPECT_EQ(a.toString(), "tcp://127.0.0.1:8080");
  EXPECT_EQ(str(a.toKjAddress()), "127.0.0.1:8080");
  EXPECT_EQ(a, Address::parse("tcp://127.0.0.1:8080"));
}

TEST(AddressTest, ParsesBracketedIpv6) {
  auto a = Address::parse("tcp://[::1]:9000");
  EXPECT_EQ(a.kind, Address::Kind::TCP);
  EXPECT_EQ(a.host, "::1");  // stored without brackets
  EXPECT_EQ(a.port, 9000);
  EXPECT_EQ(a.toString(), "tcp://[::1]:9000");
  EXPECT_EQ(str(a.toKjAddress()), "[::1]:9000");

  auto bare = Address::parse("[fe80::1:2]:80");
  EXPECT_EQ(bare.host, "fe80::1:2");
  EXPECT_EQ(bare.port, 80);
  EXPECT_EQ(bare.toString(), "tcp://[fe80::1:2]:80");
}

TEST(AddressTest, PortZeroAndPortLimits) {
  auto zero = Address::parse("localhost:0");
  EXPECT_EQ(zero.port, 0);
  EXPECT_EQ(zero.toString(), "tcp://localhost:0");
  EXPECT_EQ(str(zero.toKjAddress()), "localhost:0");
  EXPECT_EQ(Address::parse("h:65535").port, 65535);
  EXPECT_EQ(Address::parse("h:1").port, 1);
}

TEST(AddressTest, CanonicalTextParsesBackToTheSameAddress) {
  for (const char* text :
       {"tcp://h:1", "h:2", "tcp://[::1]:3", "[2001:db8::5]:4", "tcp://10.1.2.3:65535",
        "unix:/tmp/x.sock", "unix:///run/a", "unix:relative.sock"}) {
    SCOPED_TRACE(text);
    auto a = Address::parse(text);
    EXPECT_EQ(Address::parse(ptr(a.toString())), a);
  }
}

TEST(AddressTest, DefaultIsTcpWithEmptyHost) {
  Address a;
  EXPECT_EQ(a.kind, Address::Kind::TCP);
  EXPECT_EQ(a.port, 0);
}

// ---- Unix ----

TEST(AddressTest, ParsesUnixPath) {
  auto a = Address::parse("unix:/tmp/troupe.sock");
  EXPECT_EQ(a.kind, Address::Kind::UNIX);
  EXPECT_EQ(a.path, "/tmp/troupe.sock");
  EXPECT_EQ(a.host, "");
  EXPECT_EQ(a.toString(), "unix:/tmp/troupe.sock");
  EXPECT_EQ(str(a.toKjAddress()), "unix:/tmp/troupe.sock");
}

TEST(AddressTest, ParsesUnixUrlForm) {
  auto a = Address::parse("unix:///tmp/troupe.sock");
  EXPECT_EQ(a.kind, Address::Kind::UNIX);
  EXPECT_EQ(a.path, "/tmp/troupe.sock");
  EXPECT_EQ(a.toString(), "unix:/tmp/troupe.sock");  // canonical form
  EXPECT_EQ(a, Address::parse("unix:/tmp/troupe.sock"));
}

TEST(AddressTest, UnixPathLengthLimit) {
  // sun_path holds 108 bytes including the terminating NUL.
  std::string longest = "/" + std::string(106, 'p');
  ASSERT_EQ(longest.size(), 107u);
  auto a = Address::parse(ptr("unix:" + longest));
  EXPECT_EQ(a.path, longest);

  std::string tooLong = "/" + std::string(107, 'p');
  ASSERT_EQ(tooLong.size(), 108u);
  auto msg = invalidArgument(ptr("unix:" + tooLong));
  EXPECT_TRUE(contains(msg, "108 bytes")) << msg;
  EXPECT_TRUE(contains(msg, "107")) << msg;
  auto viaUrl = invalidArgument(ptr("unix://" + tooLong));
  EXPECT_TRUE(contains(viaUrl, "108 bytes")) << viaUrl;
}

TEST(AddressTest, EmptyUnixPathIsRejected) {
  auto msg = invalidArgument("unix:");
  EXPECT_TRUE(contains(msg, "empty socket path")) << msg;
  auto url = invalidArgument("unix://");
  EXPECT_TRUE(contains(url, "empty socket path")) << url;
}

// ---- errors ----

TEST(AddressTest, ErrorsQuoteTheTextAndTheExpectedForms) {
  auto msg = invalidArgument("nowhere");
  EXPECT_TRUE(contains(msg, "troupe.invalid_argument: ")) << msg;
  EXPECT_TRUE(contains(msg, "'nowhere'")) << msg;
  EXPECT_TRUE(contains(msg, "no port")) << msg;
  EXPECT_TRUE(contains(msg, "tcp://HOST:PORT")) << msg;
}

TEST(AddressTest, MissingPortIsRejected) {
  EXPECT_TRUE(contains(invalidArgument("tcp://host"), "no port"));
  EXPECT_TRUE(contains(invalidArgument(""), "no port"));
  EXPECT_TRUE(contains(invalidArgument("host:"), "bad port"));
  EXPECT_TRUE(contains(invalidArgument("tcp://[::1]"), "no port"));
  EXPECT_TRUE(contains(invalidArgument("[::1]:"), "bad port"));
  invalidArgument("[::1]x:80");
}

TEST(AddressTest, PortAboveLimitIsRejected) {
  EXPECT_TRUE(contains(invalidArgument("h:65536"), "65535"));
  EXPECT_TRUE(contains(invalidArgument("h:99999"), "65535"));
  invalidArgument("h:123456");
  invalidArgument("h:99999999999999999999");
}

TEST(AddressTest, NonNumericPortIsRejected) {
  for (const char* text : {"h:http", "h:-1", "h:+1", "h: 80", "h:80 ", "h:8o", "h:0x50"}) {
    SCOPED_TRACE(text);
    auto msg = invalidArgument(text);
    EXPECT_TRUE(contains(msg, "port")) << msg;
  }
}

TEST(AddressTest, EmptyHostIsRejected) {
  EXPECT_TRUE(contains(invalidArgument(":80"), "empty host"));
  EXPECT_TRUE(contains(invalidArgument("tcp://:80"), "empty host"));
  EXPECT_TRUE(contains(invalidArgument("tcp://[]:80"), "empty host"));
}

TEST(AddressTest, UnknownSchemeIsRejected) {
  EXPECT_TRUE(contains(invalidArgument("http://x:1"), "unknown scheme"));
  EXPECT_TRUE(contains(invalidArgument("udp://x:1"), "unknown scheme"));
  EXPECT_TRUE(contains(invalidArgument("TCP://x:1"), "unknown scheme"));
  EXPECT_TRUE(contains(invalidArgument("://x:1"), "unknown scheme"));
}

TEST(AddressTest, UnbracketedIpv6IsRejected) {
  EXPECT_TRUE(contains(invalidArgument("::1:80"), "brackets"));
  EXPECT_TRUE(contains(invalidArgument("tcp://fe80::1:80"), "brackets"));
}

TEST(AddressTest, UnclosedBracketIsRejected) {
  EXPECT_TRUE(contains(invalidArgument("[::1:80"), "unclosed"));
}

TEST(AddressTest, ControlCharactersAreRejected) {
  for (char c : {'\x01', '\t', '\n', '\r', '\x1f', '\x7f'}) {
    SCOPED_TRACE(static_cast<int>(c));
    for (std::string text : {std::string("ho") + c + "st:80", std::string("unix:/tmp/a") + c,
                             std::string("h:8") + c + "0"}) {
      auto msg = invalidArgument(ptr(text));
      EXPECT_TRUE(contains(msg, "control character")) << msg;
      EXPECT_FALSE(contains(msg, std::string(1, c))) << "raw control byte echoed: " << msg;
    }
  }
}

}  // namespace
}  // namespace troupe
