#include "troupe/resolver/resolver.h"

#include "troupe/base/errors.h"

namespace troupe {

kj::StringPtr toString(JobState state) {
  switch (state) {
    case JobState::RUNNING:
      return "running";
    case JobState::ENDED:
      return "ended";
  }
  return "unknown";
}

kj::StringPtr jobOutcome(const JobStatus& status) {
  if (status.state == JobState::RUNNING) return "running";
  for (kj::StringPtr phase : {"succeeded"_kj, "failed"_kj, "stopped"_kj, "unschedulable"_kj}) {
    auto& r = status.reason;
    if (r.compare(0, phase.size(), phase.cStr()) == 0 &&
        (r.size() == phase.size() || r[phase.size()] == ':')) {
      return phase;
    }
  }
  return "ended";
}

kj::StringPtr toString(WatchEvent::Type type) {
  switch (type) {
    case WatchEvent::Type::ADDED:
      return "ADDED";
    case WatchEvent::Type::CHANGED:
      return "CHANGED";
    case WatchEvent::Type::REMOVED:
      return "REMOVED";
    case WatchEvent::Type::SYNCED:
      return "SYNCED";
    case WatchEvent::Type::JOB_ENDED:
      return "JOB_ENDED";
  }
  return "?";
}

bool jobOverlapsPrefix(kj::StringPtr jobId, kj::StringPtr prefix) {
  // Compare "<jobId>/" with the prefix over the shorter of the two.
  size_t jobLength = jobId.size() + 1;
  size_t n = kj::min(jobLength, prefix.size());
  for (size_t i = 0; i < n; ++i) {
    char c = i < jobId.size() ? jobId[i] : '/';
    if (prefix[i] != c) return false;
  }
  return true;
}

std::string cutLauncherKind(const std::string& launcher) {
  if (launcher.size() <= MAX_LAUNCHER_KIND_BYTES) return launcher;
  size_t end = MAX_LAUNCHER_KIND_BYTES;
  while (end > 0 && (static_cast<unsigned char>(launcher[end]) & 0xC0) == 0x80) --end;
  return launcher.substr(0, end);
}

std::string cutJobReason(const std::string& reason) {
  if (reason.size() <= MAX_JOB_REASON_BYTES) return reason;
  size_t end = MAX_JOB_REASON_BYTES - 3;
  while (end > 0 && (static_cast<unsigned char>(reason[end]) & 0xC0) == 0x80) --end;
  return reason.substr(0, end) + "...";
}

void validatePrefix(kj::StringPtr prefix) {
  if (prefix.size() > MAX_PREFIX_LENGTH) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("prefix is ", prefix.size(), " bytes long (the limit is ", MAX_PREFIX_LENGTH,
                       ")"));
  }
  for (size_t i = 0; i < prefix.size(); ++i) {
    unsigned char c = prefix[i];
    if (c < 0x21 || c > 0x7e) {
      kj::StringPtr what = c == ' '                ? " (a space)"_kj
                           : c < 0x20 || c == 0x7f ? " (a control character)"_kj
                                                   : " (not ASCII)"_kj;
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("prefix has byte ", c < 0x10 ? "0x0" : "0x", kj::hex(c), what,
                         " at offset ", i, "; prefixes are printable ASCII without spaces"));
    }
  }
}

kj::Maybe<kj::Own<JobControlOffer>> Resolver::serveJobControl(kj::StringPtr, std::string,
                                                              std::string, kj::Own<JobControl>) {
  return nullptr;
}

kj::Promise<void> Resolver::stopJob(kj::StringPtr jobId, kj::Duration, std::string) {
  return makeError(ErrorCode::UNIMPLEMENTED,
                   kj::str("this resolver cannot reach the launcher of job '", jobId,
                           "'; stop it where it runs (its troupe launch, or scancel)"));
}

kj::Promise<LogPiece> Resolver::readJobLog(kj::StringPtr jobId, uint32_t, uint64_t, uint32_t) {
  return makeError(ErrorCode::UNIMPLEMENTED,
                   kj::str("this resolver cannot reach the launcher of job '", jobId,
                           "'; read its logs where it runs (its log directory)"));
}

}  // namespace troupe
