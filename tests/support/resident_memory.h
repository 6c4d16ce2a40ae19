#pragma once
// This process's resident memory, for tests that state what an abuse costs before and after.

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>

namespace troupe::test {

// AddressSanitizer keeps freed memory in quarantine and never gives it back when asked, so
// what a test states about the memory malloc returns holds only without it.
// GCC says so with __SANITIZE_ADDRESS__, clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool MEMORY_IS_SANITIZED = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool MEMORY_IS_SANITIZED = true;
#else
constexpr bool MEMORY_IS_SANITIZED = false;
#endif
#else
constexpr bool MEMORY_IS_SANITIZED = false;
#endif

// The bytes /proc/self/status gives for `field` ("VmRSS:", "VmSize:").
inline uint64_t statusBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size())) * 1024;
  }
  throw std::runtime_error("no " + field + " in /proc/self/status");
}

// Resident bytes now.
inline uint64_t residentBytes() { return statusBytes("VmRSS:"); }

// Virtual bytes now: what was allocated, touched or not.
inline uint64_t virtualBytes() { return statusBytes("VmSize:"); }

}  // namespace troupe::test
