#pragma once
// Jobs from Python: troupe.LocalLauncher and the handles of the jobs it starts, on the module's
// loop (runtime.h), and troupe.ResourceConfig.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "python/src/client.h"
#include "troupe/jobs/local_launcher.h"

namespace troupe::python {

class PyJob : public std::enable_shared_from_this<PyJob> {
public:
  PyJob(std::shared_ptr<class PyLauncher> launcher, std::string id);

  std::string status();
  std::string reason();
  // The final phase, once reached; raises DeadlineExceeded after `timeout` seconds.
  std::string wait(double timeout);
  std::vector<std::string> logs(size_t lines);
  void terminate(std::optional<double> grace);
  // Per replica: (index, pid, starts, log path).
  pybind11::list replicas();

  std::shared_ptr<PyLauncher> launcher;
  LoopOwned<JobHandle> handle;
  std::string id;
};

class PyLauncher : public std::enable_shared_from_this<PyLauncher> {
public:
  explicit PyLauncher(LocalLauncherOptions options);

  std::shared_ptr<PyJob> submit(const std::string& name, std::vector<std::string> argv,
                                uint32_t replicas, std::optional<ResourceConfig> resources,
                                std::map<std::string, std::string> environment,
                                uint32_t maxRetriesFailure);
  // Stops every job (SIGTERM, SIGKILL after `grace`) and waits until they are gone.
  void drain(std::optional<double> grace);

  LoopOwned<LocalLauncher> launcher;
  std::string resolverUrl;
  std::string logDirectory;
};

}  // namespace troupe::python
