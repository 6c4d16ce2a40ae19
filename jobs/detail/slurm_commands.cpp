#include "troupe/jobs/detail/slurm_commands.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uv.h>

#include <sstream>

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/io.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"
#include "troupe/jobs/detail/replica_environment.h"

namespace troupe::jobs_detail {

namespace {

// The text in the memory file `fd`, from its start, at most MAX_COMMAND_OUTPUT bytes.
std::string readAll(int fd) {
  std::string text;
  char buffer[8192];
  if (::lseek(fd, 0, SEEK_SET) < 0) return text;
  while (text.size() < MAX_COMMAND_OUTPUT) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  if (text.size() > MAX_COMMAND_OUTPUT) text.resize(MAX_COMMAND_OUTPUT);
  return text;
}

using JsonValue = capnp::JsonValue;

kj::Maybe<JsonValue::Reader> field(JsonValue::Reader object, kj::StringPtr name) {
  if (!object.isObject()) return nullptr;
  for (auto f : object.getObject()) {
    if (f.getName() == name) return f.getValue();
  }
  return nullptr;
}

std::string text(JsonValue::Reader object, kj::StringPtr name) {
  KJ_IF_MAYBE(v, field(object, name)) {
    if (v->isString()) return v->getString().cStr();
  }
  return {};
}

uint64_t number(JsonValue::Reader object, kj::StringPtr name) {
  KJ_IF_MAYBE(v, field(object, name)) {
    if (v->isNumber() && v->getNumber() >= 0) return static_cast<uint64_t>(v->getNumber());
  }
  return 0;
}

}  // namespace

std::string findCommand(const std::string& name) {
  KJ_IF_MAYBE(found, searchPath(name)) {
    return *found;
  }
  const char* path = getenv("PATH");
  throwError(ErrorCode::FAILED,
             kj::str("the Slurm command '", name, "' is not on PATH (", path != nullptr ? path : "",
                     "); is Slurm installed here?"));
}

kj::Promise<CommandOutput> runCommand(EventLoop& loop, std::vector<std::string> argv,
                                      std::vector<std::string> env, kj::Duration timeout) {
  KJ_REQUIRE(!argv.empty());
  int fd = ::memfd_create("troupe-command-output", MFD_CLOEXEC);
  if (fd < 0) {
    throwError(ErrorCode::FAILED,
               kj::str("cannot run ", argv[0], ": memfd_create: ", strerror(errno)));
  }
  kj::AutoCloseFd output(fd);
  SpawnOptions options;
  options.file = findCommand(argv[0]);
  options.args = argv;
  options.env = kj::mv(env);
  options.outputFd = output;
  auto process = kj::heap<Subprocess>(loop.uvLoop(), options);
  auto exited = process->exited();
  auto done = exited.then([fd = output.get()](ExitStatus status) {
    return CommandOutput{status, readAll(fd)};
  });
  return loop.timer()
      .timeoutAfter(timeout, kj::mv(done))
      .attach(kj::mv(process), kj::mv(output))
      .catch_([argv = kj::mv(argv), timeout](kj::Exception&& e) -> CommandOutput {
        if (e.getType() == kj::Exception::Type::OVERLOADED ||
            e.getDescription().startsWith("operation timed out")) {
          throwError(ErrorCode::DEADLINE_EXCEEDED,
                     kj::str(argv[0], " did not finish within ", timeout / kj::MILLISECONDS,
                             " ms; it was killed"));
        }
        kj::throwFatalException(kj::mv(e));
      });
}

CommandOutput runCommandNow(const std::vector<std::string>& argv,
                            const std::vector<std::string>& env, kj::Duration timeout) {
  KJ_REQUIRE(!argv.empty());
  auto file = findCommand(argv[0]);
  int fd = ::memfd_create("troupe-command-output", MFD_CLOEXEC);
  if (fd < 0) {
    throwError(ErrorCode::FAILED,
               kj::str("cannot run ", argv[0], ": memfd_create: ", strerror(errno)));
  }
  kj::AutoCloseFd output(fd);
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = stdio[2].flags = UV_INHERIT_FD;
  stdio[1].data.fd = stdio[2].data.fd = fd;

  struct State {
    bool exited = false;
    bool timedOut = false;
    ExitStatus status;
    uv_process_t process;
    uv_timer_t timer;
  } state;
  uv_loop_t uv;
  uv_loop_init(&uv);
  uv_process_options_t options{};
  options.file = file.c_str();
  options.args = args.data();
  options.env = envp.data();
  options.stdio_count = 3;
  options.stdio = stdio;
  options.exit_cb = [](uv_process_t* p, int64_t code, int signal) {
    auto* s = static_cast<State*>(p->data);
    s->exited = true;
    s->status = ExitStatus{code, signal};
  };
  state.process.data = &state;
  int spawned = uv_spawn(&uv, &state.process, &options);
  if (spawned == 0) {
    uv_timer_init(&uv, &state.timer);
    state.timer.data = &state;
    uv_timer_start(
        &state.timer,
        [](uv_timer_t* t) {
          auto* s = static_cast<State*>(t->data);
          s->timedOut = true;
          uv_process_kill(&s->process, SIGKILL);
        },
        static_cast<uint64_t>(timeout / kj::MILLISECONDS), 0);
    while (!state.exited) uv_run(&uv, UV_RUN_ONCE);
    uv_close(reinterpret_cast<uv_handle_t*>(&state.timer), nullptr);
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&state.process), nullptr);
  uv_run(&uv, UV_RUN_DEFAULT);
  uv_loop_close(&uv);
  if (spawned < 0) {
    throwError(ErrorCode::FAILED, kj::str("cannot start '", file, "': ", uv_strerror(spawned)));
  }
  if (state.timedOut) {
    throwError(ErrorCode::DEADLINE_EXCEEDED,
               kj::str(argv[0], " did not finish within ", timeout / kj::MILLISECONDS,
                       " ms; it was killed"));
  }
  return CommandOutput{state.status, readAll(fd)};
}

std::string describeFailure(const std::vector<std::string>& argv, const CommandOutput& output) {
  // One line: the command's lines joined with "; ".
  std::string text;
  std::istringstream lines(output.text);
  for (std::string line; std::getline(lines, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) text += (text.empty() ? "" : "; ") + line;
  }
  return argv[0] + " " + describe(output.status) + (text.empty() ? "" : ": " + text);
}

std::vector<SlurmJobInfo> parseSqueueJson(kj::ArrayPtr<const char> json) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<JsonValue>();
  capnp::JsonCodec codec;
  codec.setMaxNestingDepth(64);
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { codec.decodeRaw(json, root); })) {
    throwError(ErrorCode::FAILED,
               kj::str("squeue --json printed what is not JSON: ", e->getDescription()));
  }
  std::vector<SlurmJobInfo> jobs;
  KJ_IF_MAYBE(list, field(root.asReader(), "jobs")) {
    if (!list->isArray()) throwError(ErrorCode::FAILED, "squeue --json: 'jobs' is not a list");
    for (auto job : list->getArray()) {
      SlurmJobInfo info;
      info.id = number(job, "job_id");
      info.name = text(job, "name");
      info.comment = text(job, "comment");
      info.state = text(job, "job_state");
      info.reason = text(job, "state_reason");
      info.restarts = static_cast<uint32_t>(number(job, "restart_cnt"));
      info.tasks = static_cast<uint32_t>(number(job, "tasks"));
      if (info.id != 0) jobs.push_back(kj::mv(info));
    }
  } else {
    throwError(ErrorCode::FAILED, "squeue --json printed no 'jobs'");
  }
  return jobs;
}

kj::Maybe<SlurmJobInfo> parseScontrolJob(kj::StringPtr line) {
  // Key=Value pairs separated by spaces; a value runs to the next " Key=" (a comment or a
  // command may hold spaces, so splitting on spaces alone would cut it).
  std::string s = line.cStr();
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t at = 0;
  while (at < s.size()) {
    while (at < s.size() && s[at] == ' ') ++at;
    size_t eq = s.find('=', at);
    if (eq == std::string::npos) break;
    std::string key = s.substr(at, eq - at);
    size_t end = eq + 1;
    for (;;) {
      size_t space = s.find(' ', end);
      if (space == std::string::npos) {
        end = s.size();
        break;
      }
      // The next word is a key when it has '=' before any space and starts with a capital.
      size_t nextEq = s.find('=', space + 1);
      size_t nextSpace = s.find(' ', space + 1);
      if (nextEq != std::string::npos && (nextSpace == std::string::npos || nextEq < nextSpace) &&
          space + 1 < s.size() && isupper(static_cast<unsigned char>(s[space + 1]))) {
        end = space;
        break;
      }
      end = space + 1;
    }
    pairs.emplace_back(key, s.substr(eq + 1, end - eq - 1));
    at = end;
  }
  SlurmJobInfo info;
  bool found = false;
  // A number that is not one makes the line something other than a job's.
  auto number = [](const std::string& text, uint64_t max) {
    return parseWholeNumber(kj::arrayPtr(text.data(), text.size()), max);
  };
  for (auto& [key, value] : pairs) {
    if (key == "JobId") {
      KJ_IF_MAYBE(id, number(value, UINT64_MAX)) {
        info.id = *id;
      } else {
        return nullptr;
      }
      found = info.id != 0;
    } else if (key == "JobName") {
      info.name = value;
    } else if (key == "Comment") {
      info.comment = value == "(null)" ? "" : value;
    } else if (key == "JobState") {
      info.state = value;
    } else if (key == "Reason") {
      info.reason = value;
    } else if (key == "Restarts") {
      KJ_IF_MAYBE(n, number(value, UINT32_MAX)) {
        info.restarts = static_cast<uint32_t>(*n);
      } else {
        return nullptr;
      }
    } else if (key == "ExitCode") {
      // "3:0": the exit status, then the signal that ended it.
      auto colon = value.find(':');
      auto status = number(value.substr(0, colon), 255);
      auto signal = colon == std::string::npos ? kj::Maybe<uint64_t>(uint64_t{0})
                                               : number(value.substr(colon + 1), 255);
      if (status == nullptr || signal == nullptr) return nullptr;
      info.exitCode = static_cast<int>(KJ_ASSERT_NONNULL(status));
      info.exitSignal = static_cast<int>(KJ_ASSERT_NONNULL(signal));
    }
  }
  if (!found) return nullptr;
  return info;
}

bool slurmStateIsFinal(kj::StringPtr state) {
  for (auto final : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                     "BOOT_FAIL", "DEADLINE", "PREEMPTED"}) {
    if (state == final) return true;
  }
  return false;
}

bool pendingReasonIsFinal(kj::StringPtr reason) {
  for (auto never :
       {"PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints",
        "InvalidAccount", "InvalidQOS", "QOSMaxCpuPerJobLimit", "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit", "AssocMaxCpuPerJobLimit", "AssocMaxNodePerJobLimit",
        "AssocMaxWallDurationPerJobLimit", "DependencyNeverSatisfied"}) {
    if (reason == never) return true;
  }
  return false;
}

}  // namespace troupe::jobs_detail
