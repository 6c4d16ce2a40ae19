// troupe logs JOB [REPLICA] [--follow] [--lines N]: a job's replicas' output, read from its
// launcher through the resolver.

#include <signal.h>
#include <stdio.h>

#include <string>
#include <vector>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

// How often --follow asks for more.
constexpr kj::Duration FOLLOW_INTERVAL = 500 * kj::MILLISECONDS;
// What one read asks for.
constexpr uint32_t PIECE_BYTES = 256 * 1024;

// One replica's log as it is read: where to read on, and the start of a line not yet ended.
struct Reader {
  uint32_t replica = 0;
  uint64_t offset = 0;
  std::string partial;
};

class LogsCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(kj::MainBuilder(
                   context, VERSION_TEXT,
                   "Prints the output (stdout and stderr) of job JOB's replicas, or of replica "
                   "REPLICA alone, read from the job's launcher through the registry, from any "
                   "machine that reaches it. Without REPLICA each line starts with \"[INDEX] \". A "
                   "launcher that is gone leaves a message saying where the files are; --follow "
                   "ends when it goes (a troupe launch goes when its job ends).")
                   .addOption(
                       {'f', "follow"},
                       [this]() {
                         following = true;
                         return true;
                       },
                       "Go on printing what the replicas write, until interrupted.")
                   .addOptionWithArg(
                       {'n', "lines"},
                       [this](kj::StringPtr text) {
                         lines = parseWhole("--lines", text, 0);
                         return true;
                       },
                       "N", "Start with the last N lines of each log (default: all of it).")
                   .addOptionWithArg({"resolver"}, storeIn(resolver), "URL",
                                     "registry://HOST:PORT, registry+unix:PATH (default: "
                                     "$TROUPE_RESOLVER). Only the registry relays to launchers.")
                   .expectArg("JOB", storeIn(jobId))
                   .expectOptionalArg("REPLICA",
                                      [this](kj::StringPtr text) {
                                        auto index = parseWhole("REPLICA", text, 0);
                                        if (index > UINT32_MAX) {
                                          throw UsageError{"REPLICA is a replica's index, from 0"};
                                        }
                                        only = static_cast<uint32_t>(index);
                                        return true;
                                      }))
        .build();
  }

  int run() override {
    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    opened = &command.resolver(resolver);
    auto& ws = loop.waitScope();
    // The first replica's size says how many there are.
    auto first = opened->readJobLog(jobId.c_str(), only.orDefault(0), 0, 0).wait(ws);
    if (only == nullptr) {
      for (uint32_t i = 0; i < first.replicas; ++i) readers.push_back(Reader{i});
    } else {
      readers.push_back(Reader{KJ_ASSERT_NONNULL(only)});
    }
    prefixed = only == nullptr;
    KJ_IF_MAYBE(n, lines) {
      for (auto& r : readers) r.offset = startOfLastLines(r.replica, *n).wait(ws);
    }
    readAll(0).wait(ws);
    if (!following) {
      for (auto& r : readers) flushPartial(r);
      return 0;
    }
    auto stopped = loop.onSignal({SIGINT, SIGTERM}).ignoreResult();
    // The launcher goes when its job ends (a troupe launch): following is then over.
    auto followed = follow(loop).catch_([](kj::Exception&& e) -> kj::Promise<void> {
      if (errorCode(e) != ErrorCode::UNREACHABLE) return kj::mv(e);
      fprintf(stderr, "troupe logs: %s\n", errorMessage(e).cStr());
      return kj::READY_NOW;
    });
    followed.exclusiveJoin(kj::mv(stopped)).wait(ws);
    for (auto& r : readers) flushPartial(r);
    return 0;
  }

private:
  // Where the last `count` lines of the replica's log start: read back from the end in
  // pieces until `count` line ends are behind the start (a last line without one counts).
  kj::Promise<uint64_t> startOfLastLines(uint32_t replica, uint64_t count) {
    return opened->readJobLog(jobId.c_str(), replica, 0, 0)
        .then([this, replica, count](LogPiece sized) {
          return scanBack(replica, count, sized.size, sized.size, 0);
        });
  }

  kj::Promise<uint64_t> scanBack(uint32_t replica, uint64_t count, uint64_t size, uint64_t end,
                                 uint64_t seen) {
    if (end == 0 || count == 0) return count == 0 ? size : uint64_t{0};
    uint64_t from = end > PIECE_BYTES ? end - PIECE_BYTES : 0;
    return opened->readJobLog(jobId.c_str(), replica, from, static_cast<uint32_t>(end - from))
        .then([this, replica, count, size, from,
               seen](LogPiece piece) mutable -> kj::Promise<uint64_t> {
          for (size_t i = piece.data.size(); i > 0; --i) {
            uint64_t at = from + i - 1;
            // The newline that ends the file's last line starts no line.
            if (piece.data[i - 1] == '\n' && at + 1 < size && ++seen == count) return at + 1;
          }
          return scanBack(replica, count, size, from, seen);
        });
  }

  // Reads every replica's log up to its end now, printing as it goes.
  kj::Promise<void> readAll(size_t index) {
    if (index == readers.size()) return kj::READY_NOW;
    auto& r = readers[index];
    return opened->readJobLog(jobId.c_str(), r.replica, r.offset, PIECE_BYTES)
        .then([this, index](LogPiece piece) -> kj::Promise<void> {
          auto& r = readers[index];
          r.offset = piece.next;
          print(r, piece.data);
          if (piece.next < piece.size && !piece.data.empty()) return readAll(index);
          return readAll(index + 1);
        });
  }

  kj::Promise<void> follow(EventLoop& loop) {
    return loop.timer()
        .afterDelay(FOLLOW_INTERVAL)
        .then([this]() { return readAll(0); })
        .then([this, &loop]() { return follow(loop); });
  }

  void print(Reader& r, const std::string& data) {
    if (!prefixed) {
      fwrite(data.data(), 1, data.size(), stdout);
      fflush(stdout);
      return;
    }
    r.partial += data;
    size_t start = 0;
    for (size_t nl; (nl = r.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      printf("[%u] %.*s\n", r.replica, static_cast<int>(nl - start), r.partial.data() + start);
    }
    r.partial.erase(0, start);
    fflush(stdout);
  }

  void flushPartial(Reader& r) {
    if (!prefixed || r.partial.empty()) return;
    printf("[%u] %s\n", r.replica, r.partial.c_str());
    r.partial.clear();
  }

  bool following = false;
  kj::Maybe<uint64_t> lines;
  std::string resolver;
  CredentialFlags credentialFlags;
  std::string jobId;
  kj::Maybe<uint32_t> only;
  bool prefixed = true;
  Resolver* opened = nullptr;
  std::vector<Reader> readers;
};

}  // namespace

kj::Own<Command> logsCommand() { return kj::heap<LogsCommand>(); }

}  // namespace troupe::cli
