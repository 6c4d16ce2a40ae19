#include "troupe/jobs/detail/replica_environment.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>

#include <kj/string.h>

extern char** environ;

namespace troupe::jobs_detail {

namespace {

// Variables of the launcher's own environment a replica must not inherit: they describe the
// launcher's place in some other job.
bool inheritable(kj::StringPtr name) {
  return name != "TROUPE_ENTRYPOINT" && name != "TROUPE_LAUNCHER_PID";
}

}  // namespace

std::vector<std::string> replicaEnvironment(const JobRequest& request,
                                            const ReplicaEnvironment& how) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    kj::StringPtr entry = *e;
    KJ_IF_MAYBE(eq, entry.findFirst('=')) {
      auto name = kj::heapString(entry.slice(0, *eq));
      if (inheritable(name)) env[name.cStr()] = entry.slice(*eq + 1).cStr();
    }
  }
  env["TROUPE_JOB_ID"] = request.name;
  KJ_IF_MAYBE(index, how.taskIndex) {
    env["TROUPE_TASK_INDEX"] = std::to_string(*index);
  } else {
    env.erase("TROUPE_TASK_INDEX");
  }
  env["TROUPE_NUM_TASKS"] = std::to_string(how.numTasks);
  env["TROUPE_RESOLVER"] = how.resolverUrl;
  if (how.jobTokenFile.empty()) {
    env.erase("TROUPE_JOB_TOKEN_FILE");  // the launcher's own, if it is a replica itself
  } else {
    env["TROUPE_JOB_TOKEN_FILE"] = how.jobTokenFile;
  }
  if (how.gpus.empty() && how.hideGpus) {
    env["CUDA_VISIBLE_DEVICES"] = "";  // hide the GPUs other replicas were given
  }
  for (auto& [name, value] : request.resources.deviceEnvironment(how.gpus, request.environment)) {
    env[name] = value;
  }
  if (request.entrypoint.kind == Entrypoint::Kind::FUNCTION) {
    env["TROUPE_ENTRYPOINT"] = request.entrypoint.functionName;
    KJ_IF_MAYBE(pid, how.launcherPid) {
      env["TROUPE_LAUNCHER_PID"] = std::to_string(*pid);
    }
  }
  for (auto& [name, value] : request.environment) env[name] = value;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

kj::Maybe<std::string> searchPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return nullptr;
}

std::string ownProgramPath() {
  char path[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(path, static_cast<size_t>(n));
}

}  // namespace troupe::jobs_detail
