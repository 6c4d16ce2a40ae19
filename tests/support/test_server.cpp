#include "tests/support/test_server.h"

#include <sstream>
#include <stdexcept>

namespace troupe::test {

TestServer::TestServer(std::vector<std::string> args, std::vector<std::string> env)
    : process(TROUPE_TEST_SERVER_PATH, args, env) {
  std::string line = process.readLine(15000);
  std::istringstream in(line);
  std::string word;
  in >> word >> address >> incarnation;
  if (word != "LISTENING" || address.empty()) {
    throw std::runtime_error("test server did not start; it printed: '" + line + "'");
  }
}

}  // namespace troupe::test
