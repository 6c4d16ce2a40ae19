#include "troupe/jobs/job_request.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/endpoint.h"
#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/base/logging.h"
#include "troupe/base/parse_number.h"

namespace troupe {

namespace {

kj::String quoted(const std::string& s) {
  return printable(kj::ArrayPtr<const char>(s.data(), s.size()));
}

[[noreturn]] void invalid(kj::StringPtr message) {
  throwError(ErrorCode::INVALID_ARGUMENT, kj::str("invalid job request: ", message));
}

bool hasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

// Why `name` cannot be an environment variable name; empty when it can.
kj::String envNameProblem(const std::string& name) {
  if (name.empty()) return kj::str("is empty");
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = name[i];
    if (c == '=') return kj::str("contains '=' at byte ", i);
    if (c < 0x20 || c == 0x7f) return kj::str("contains a control character at byte ", i);
  }
  return kj::String();
}

// This process's command line, from /proc/self/cmdline (one NUL-terminated string per
// argument).
std::vector<std::string> ownCommandLine() {
  std::vector<std::string> args;
  int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return args;
  std::string all;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    all.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return args;
}

// Dies with the launcher (see Entrypoints). Returns false when the launcher is already gone.
bool followLauncher() {
  const char* value = ::getenv("TROUPE_LAUNCHER_PID");
  if (value == nullptr) return true;
  auto parsed = parseWholeNumber(kj::StringPtr(value), INT32_MAX);
  ::unsetenv("TROUPE_LAUNCHER_PID");
  uint64_t pid = parsed.orDefault(0);
  if (pid == 0) return true;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher may have died before the request took effect: then we were re-parented.
  return ::getppid() == static_cast<pid_t>(pid);
}

}  // namespace

Entrypoint Entrypoint::binary(std::string path, std::vector<std::string> args) {
  Entrypoint e;
  e.kind = Kind::BINARY;
  e.path = kj::mv(path);
  e.args = kj::mv(args);
  return e;
}

Entrypoint Entrypoint::function(std::string name, std::vector<std::string> args) {
  Entrypoint e;
  e.kind = Kind::FUNCTION;
  e.functionName = kj::mv(name);
  e.args = kj::mv(args);
  return e;
}

void JobRequest::validate() const {
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { validateJobId(name); })) {
    invalid(kj::str("name: ", errorMessage(*e)));
  }
  switch (entrypoint.kind) {
    case Entrypoint::Kind::BINARY:
      if (entrypoint.path.empty()) invalid("the binary entrypoint's path is empty");
      if (hasNul(entrypoint.path)) {
        invalid(kj::str("the binary path '", quoted(entrypoint.path), "' contains a NUL byte"));
      }
      break;
    case Entrypoint::Kind::FUNCTION: {
      if (entrypoint.functionName.empty()) invalid("the function entrypoint's name is empty");
      for (unsigned char c : entrypoint.functionName) {
        if (c <= 0x20 || c == 0x7f) {
          invalid(kj::str("the function name '", quoted(entrypoint.functionName),
                          "' contains a space or a control character"));
        }
      }
      break;
    }
    default:
      invalid("unknown entrypoint kind");
  }
  for (size_t i = 0; i < entrypoint.args.size(); ++i) {
    if (hasNul(entrypoint.args[i])) {
      invalid(kj::str("entrypoint argument ", i, " ('", quoted(entrypoint.args[i]),
                      "') contains a NUL byte"));
    }
  }
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { resources.validate(); })) {
    invalid(kj::str("resources: ", errorMessage(*e)));
  }
  if (replicaCount() == 0) invalid("the job has no replicas");
  for (auto& [key, value] : environment) {
    auto problem = envNameProblem(key);
    if (problem.size() > 0) {
      invalid(kj::str("environment variable name '", quoted(key), "' ", problem));
    }
    if (hasNul(value)) {
      invalid(kj::str("the value of environment variable ", key, " contains a NUL byte"));
    }
  }
}

std::vector<std::string> Entrypoints::replicaCommandLine(const Entrypoint& entrypoint) {
  KJ_REQUIRE(entrypoint.kind == Entrypoint::Kind::FUNCTION,
             "replicaCommandLine() is for FUNCTION entrypoints");
  std::vector<std::string> args{std::string(FLAG.cStr()), entrypoint.functionName, "--"};
  args.insert(args.end(), entrypoint.args.begin(), entrypoint.args.end());
  return args;
}

void Entrypoints::add(std::string name, Function fn) {
  if (name.empty()) {
    throwError(ErrorCode::INVALID_ARGUMENT, "an entrypoint function needs a name");
  }
  if (functions.count(name) > 0) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("an entrypoint function named '", quoted(name), "' is already registered"));
  }
  KJ_REQUIRE(fn != nullptr, "Entrypoints::add() needs a function");
  functions.emplace(kj::mv(name), kj::mv(fn));
}

kj::Maybe<int> Entrypoints::runIfReplica() const {
  const char* variable = ::getenv("TROUPE_ENTRYPOINT");
  if (variable == nullptr) return nullptr;
  std::string name = variable;
  auto commandLine = ownCommandLine();
  if (commandLine.size() < 4 || commandLine[1] != FLAG.cStr() || commandLine[2] != name ||
      commandLine[3] != "--") {
    // Inherited from a replica that started this process: not one itself.
    return nullptr;
  }
  ::unsetenv("TROUPE_ENTRYPOINT");
  std::vector<std::string> args(commandLine.begin() + 4, commandLine.end());

  auto found = functions.find(name);
  if (found == functions.end()) {
    std::string known;
    for (auto& [key, fn] : functions) known += (known.empty() ? "" : ", ") + key;
    newLogger()->error("this program has no entrypoint function named '{}' (registered: {})",
                       quoted(name).cStr(), known.empty() ? "none" : known.c_str());
    return 2;
  }
  if (!followLauncher()) {
    newLogger()->error("the launcher that started this replica is gone; exiting");
    return 1;
  }
  int status = 1;
  auto log = newLogger();
  // runCatchingExceptions also turns a std::exception into a kj::Exception.
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                EventLoop loop({.logger = log});
                status = found->second(loop, kj::mv(args));
              })) {
    log->error("entrypoint function '{}' failed: {}", name.c_str(), e->getDescription().cStr());
    log->flush();
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  return status;
}

}  // namespace troupe
