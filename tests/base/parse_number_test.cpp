// parseWholeNumber: decimal digits only, bounded, and nothing strtoull would also accept.

#include "troupe/base/parse_number.h"

#include <gtest/gtest.h>

namespace troupe {
namespace {

TEST(ParseNumberTest, ReadsDecimalDigits) {
  EXPECT_EQ(parseWholeNumber("0"_kj).orDefault(99), 0u);
  EXPECT_EQ(parseWholeNumber("7700"_kj).orDefault(0), 7700u);
  EXPECT_EQ(parseWholeNumber("010"_kj).orDefault(0), 10u);  // decimal, not octal
  EXPECT_EQ(parseWholeNumber("18446744073709551615"_kj).orDefault(0), UINT64_MAX);
}

TEST(ParseNumberTest, RefusesAnythingElse) {
  for (auto text :
       {"", " 1", "1 ", "+1", "-1", "0x10", "1e3", "1.5", "12a", "18446744073709551616"}) {
    EXPECT_EQ(parseWholeNumber(kj::StringPtr(text)), nullptr) << text;
  }
}

TEST(ParseNumberTest, RefusesValuesAboveTheBound) {
  EXPECT_EQ(parseWholeNumber("65535"_kj, 65535).orDefault(0), 65535u);
  EXPECT_EQ(parseWholeNumber("65536"_kj, 65535), nullptr);
}

}  // namespace
}  // namespace troupe
