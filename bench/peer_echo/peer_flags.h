#pragma once
// Flag parsing shared by troupe's echo programs for the peer harness.

#include <string>

namespace troupe::bench {

// Splits argv[i] into `flag` and `value`, taking "--flag=value" or "--flag value" (then moving
// `i` past the value). False when the value is missing.
inline bool takeFlag(int argc, char** argv, int& i, std::string& flag, std::string& value) {
  flag = argv[i];
  auto eq = flag.find('=');
  if (eq != std::string::npos) {
    value = flag.substr(eq + 1);
    flag = flag.substr(0, eq);
    return true;
  }
  if (i + 1 >= argc) return false;
  value = argv[++i];
  return true;
}

}  // namespace troupe::bench
