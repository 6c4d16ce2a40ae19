#pragma once
// ReplicaProcess: a replica process the launcher started for the test, held by a pidfd.

#include <sys/types.h>

#include <kj/io.h>

namespace troupe::chaos {

// Opened from a pid the launcher reports (JobHandle::replicas()) at the moment the test acts on
// it: from then on a signal sent through it reaches that process or, once the process is gone,
// none, never a later process that was given the same pid. Opening checks that the process is
// a child of this one (the launcher's replicas are), which closes the one gap left: a pid the
// launcher still reports for a moment after its process was reaped.
class ReplicaProcess {
public:
  // A pidfd on `pid`; null when no such process exists any more, or it is not our child.
  static kj::Maybe<ReplicaProcess> open(pid_t pid);

  // Sends `signal`; false when the process has exited.
  bool signal(int signal);

  pid_t pid() const { return pid_; }

private:
  ReplicaProcess(pid_t pid, kj::AutoCloseFd fd) : pid_(pid), fd(kj::mv(fd)) {}

  pid_t pid_;
  kj::AutoCloseFd fd;
};

}  // namespace troupe::chaos
