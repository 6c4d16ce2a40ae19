// main() of the chaos test: takes --seed and --minutes (chaos_settings.h) before GoogleTest reads
// its own flags.

#include <gtest/gtest.h>

#include "tests/chaos/chaos_settings.h"

int main(int argc, char** argv) {
  troupe::chaos::takeFlags(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
