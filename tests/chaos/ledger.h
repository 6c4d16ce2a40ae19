#pragma once
// The ledger of the chaos test's non-idempotent calls: each replica incarnation appends the id
// of every recordOnce() call it runs to a file of its own, and the test reads every file back at
// the end to count how many times each call ran, in replicas it killed too.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <kj/io.h>

namespace troupe::chaos {

// One replica incarnation's ledger file, <dir>/ledger-<task>-<pid>-<start ns>: a new file per
// process start, so that no two incarnations ever share one. Not thread-safe; the replica's loop
// thread owns it.
class LedgerWriter {
public:
  // Creates the file (O_EXCL: a name taken means two writers, which would be a bug here). Throws
  // FAILED with the path and errno's text when it cannot.
  LedgerWriter(const std::string& dir, uint32_t taskIndex);

  // Appends "<callId>\n" in one write(2) on an O_APPEND descriptor: once this returns, the line
  // is in the kernel's page cache, which a SIGKILL of this process cannot take back, and it is
  // never interleaved with another writer's. Throws FAILED on a short or failed write.
  void record(uint64_t callId);

  const std::string& path() const { return path_; }

private:
  std::string path_;
  kj::AutoCloseFd fd;
};

// Every ledger in `dir`, read back.
struct LedgerContents {
  // The ledger files' names.
  std::vector<std::string> files;
  // Each call id, with the files that hold it (indexes into `files`): one entry per time it ran.
  std::map<uint64_t, std::vector<uint32_t>> runs;
  // Lines that are not a whole call id ending in '\n' (a write torn by a kill, which never
  // answered its caller; reported, never counted as a run).
  size_t tornLines = 0;
};

// Reads every ledger file under `dir`. Throws FAILED when the directory cannot be read.
LedgerContents readLedgers(const std::string& dir);

// The environment variable that tells a replica where its ledger goes.
constexpr const char* LEDGER_DIR_VARIABLE = "TROUPE_CHAOS_LEDGER_DIR";

}  // namespace troupe::chaos
