#pragma once
// Jobs from Python: troupe.LocalLauncher and troupe.SlurmLauncher and the handles of the jobs
// they start, on the module's loop (runtime.h).

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "troupe/jobs/local_launcher.h"
#include "troupe/jobs/slurm_launcher.h"
#include "python/src/client.h"

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

// Either launcher, as Python holds it.
class PyLauncher : public std::enable_shared_from_this<PyLauncher> {
public:
  explicit PyLauncher(LocalLauncherOptions options);
  explicit PyLauncher(SlurmLauncherOptions options);

  std::shared_ptr<PyJob> submit(const std::string& name, std::vector<std::string> argv,
                                uint32_t replicas, std::optional<ResourceConfig> resources,
                                std::map<std::string, std::string> environment,
                                uint32_t maxRetriesFailure);
  // Stops every job (SIGTERM, SIGKILL after `grace`) and waits until they are gone.
  void drain(std::optional<double> grace);
  // The Slurm job id of job `name` (0 until sbatch answered); 0 for a local launcher.
  uint64_t slurmJobId(const std::string& name);

  LoopOwned<Launcher> launcher;
  std::string resolverUrl;
  std::string logDirectory;

private:
  // Makes launcher L on the loop; `slurmIdOf` answers slurmJobId() for it.
  template <typename L, typename Options>
  void make(Options options, kj::Function<uint64_t(L&, kj::StringPtr)> slurmIdOf);

  // Loop thread: what the launcher's own class has beyond Launcher's interface.
  kj::Function<uint64_t(kj::StringPtr)> slurmId;
};

}  // namespace troupe::python
