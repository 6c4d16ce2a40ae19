#pragma once
// This process's resident memory, for tests that state what an abuse costs before and after.

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>

namespace troupe::test {

// Resident bytes now (VmRSS in /proc/self/status).
inline uint64_t residentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  throw std::runtime_error("no VmRSS in /proc/self/status");
}

}  // namespace troupe::test
