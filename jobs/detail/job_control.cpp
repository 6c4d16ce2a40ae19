#include "troupe/jobs/detail/job_control.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kj/debug.h>
#include <kj/io.h>

#include "troupe/base/errors.h"

namespace troupe::jobs_detail {

namespace {

class LauncherJobControl final : public JobControl {
public:
  explicit LauncherJobControl(Job& job) : job(job) {}

  kj::Promise<void> stop(kj::Duration grace) override {
    return job.terminate(grace).attach(kj::addRef(job));
  }

  kj::Promise<LogPiece> readLog(uint32_t replica, uint64_t offset, uint32_t maxBytes) override {
    auto replicas = job.replicas();
    auto count = static_cast<uint32_t>(replicas.size());
    if (replica >= count) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("job '", job.id(), "' has ", count, " replica(s), numbered from 0; not ",
                         replica));
    }
    return readLogPiece(replicas[replica].logPath, offset, maxBytes, count);
  }

  kj::Promise<JobDetail> describe() override {
    JobDetail detail;
    detail.resources = job.resources();
    detail.phase = toString(job.phase()).cStr();
    for (auto& r : job.replicas()) {
      detail.replicas.push_back({.index = r.index,
                                 .state = r.state,
                                 .pid = r.pid,
                                 .host = r.host,
                                 .restarts = r.starts > 0 ? r.starts - 1 : 0});
    }
    return kj::mv(detail);
  }

private:
  Job& job;  // holds the offer that holds this
};

}  // namespace

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

kj::Maybe<kj::Own<JobControlOffer>> offerJobControl(Resolver& resolver, Job& job,
                                                    std::string credential,
                                                    const std::string& logDirectory) {
  return resolver.serveJobControl(job.id(), kj::mv(credential), hostName() + ":" + logDirectory,
                                  kj::heap<LauncherJobControl>(job));
}

LogPiece readLogPiece(const std::string& path, uint64_t offset, uint32_t maxBytes,
                      uint32_t replicas) {
  LogPiece piece;
  piece.replicas = replicas;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return piece;
    throwError(ErrorCode::FAILED, kj::str("cannot read ", path, ": ", strerror(errno)));
  }
  kj::AutoCloseFd file(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    throwError(ErrorCode::FAILED, kj::str("cannot read ", path, ": ", strerror(errno)));
  }
  piece.size = static_cast<uint64_t>(st.st_size);
  uint64_t from = kj::min(offset, piece.size);
  uint64_t want = kj::min(piece.size - from, uint64_t{kj::min(maxBytes, MAX_LOG_PIECE_BYTES)});
  piece.data.resize(want);
  size_t done = 0;
  while (done < want) {
    ssize_t n = ::pread(fd, piece.data.data() + done, want - done, static_cast<off_t>(from + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throwError(ErrorCode::FAILED, kj::str("cannot read ", path, ": ", strerror(errno)));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  piece.data.resize(done);
  piece.next = from + done;
  return piece;
}

}  // namespace troupe::jobs_detail
