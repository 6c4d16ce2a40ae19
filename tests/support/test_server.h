#pragma once
// The test server (tests/support/test_server_main.cpp) in a child process.

#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/child_process.h"

namespace troupe::test {

// Starts the test server with `args` and reads its LISTENING line; the server is killed and
// reaped when this goes.
struct TestServer {
  explicit TestServer(std::vector<std::string> args = {}, std::vector<std::string> env = {});
  ChildProcess process;
  std::string address;
  uint64_t incarnation = 0;
};

}  // namespace troupe::test
