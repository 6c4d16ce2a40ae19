#include "tests/chaos/ledger.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <kj/debug.h>

#include "troupe/base/parse_number.h"

namespace troupe::chaos {

namespace {

// Nanoseconds of the real-time clock: with the pid, a name no earlier start of a replica has.
uint64_t startStamp() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

}  // namespace

LedgerWriter::LedgerWriter(const std::string& dir, uint32_t taskIndex)
    : path_(dir + "/ledger-" + std::to_string(taskIndex) + "-" + std::to_string(getpid()) + "-" +
            std::to_string(startStamp())),
      fd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600)) {
  KJ_REQUIRE(fd.get() >= 0, "cannot create the ledger", path_, strerror(errno));
}

void LedgerWriter::record(uint64_t callId) {
  auto line = std::to_string(callId) + "\n";
  ssize_t n;
  do {
    n = ::write(fd.get(), line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  KJ_REQUIRE(n == static_cast<ssize_t>(line.size()), "cannot append to the ledger", path_,
             n < 0 ? strerror(errno) : "short write");
}

LedgerContents readLedgers(const std::string& dir) {
  LedgerContents out;
  DIR* d = ::opendir(dir.c_str());
  KJ_REQUIRE(d != nullptr, "cannot read the ledger directory", dir, strerror(errno));
  KJ_DEFER(::closedir(d));
  while (struct dirent* entry = ::readdir(d)) {
    std::string name = entry->d_name;
    if (name.rfind("ledger-", 0) != 0) continue;
    auto file = static_cast<uint32_t>(out.files.size());
    out.files.push_back(name);
    std::string path = dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::string all = text.str();
    size_t at = 0;
    while (at < all.size()) {
      size_t nl = all.find('\n', at);
      if (nl == std::string::npos) {
        ++out.tornLines;
        break;
      }
      KJ_IF_MAYBE(id, parseWholeNumber(kj::arrayPtr(all.data() + at, nl - at))) {
        out.runs[*id].push_back(file);
      } else {
        ++out.tornLines;
      }
      at = nl + 1;
    }
  }
  return out;
}

}  // namespace troupe::chaos
