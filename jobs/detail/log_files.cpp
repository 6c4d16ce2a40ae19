#include "troupe/jobs/detail/log_files.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <kj/debug.h>

#include "troupe/base/errors.h"

namespace troupe::jobs_detail {

namespace {

[[noreturn]] void failSyscall(const char* what, const std::string& path, int error) {
  kj::throwFatalException(kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                                        kj::str(what, " '", path, "': ", strerror(error))));
}

}  // namespace

void makeDirectories(const std::string& path) {
  KJ_REQUIRE(!path.empty(), "makeDirectories needs a path");
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0700) == 0 || errno == EEXIST) continue;
    failSyscall("cannot create directory", prefix, errno);
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) failSyscall("cannot create directory", path, errno);
  if (!S_ISDIR(st.st_mode)) failSyscall("cannot create directory", path, ENOTDIR);
}

kj::AutoCloseFd openLog(const std::string& path, bool truncate) {
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0);
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) failSyscall("cannot open log file", path, errno);
  return kj::AutoCloseFd(fd);
}

void appendLine(int fd, kj::StringPtr line) {
  auto text = kj::str(line, '\n');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.begin() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::vector<std::string> tailLines(const std::string& path, size_t count) {
  std::vector<std::string> lines;
  if (count == 0) return lines;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lines;
  kj::AutoCloseFd closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) return lines;

  // Read backwards in blocks until the tail holds `count` complete lines (count + 1 newlines
  // before the last byte, or the start of the file).
  constexpr off_t BLOCK = 64 * 1024;
  off_t end = st.st_size;
  off_t start = end;
  std::string tail;
  size_t newlines = 0;
  while (start > 0) {
    off_t from = std::max<off_t>(0, start - BLOCK);
    std::string block(static_cast<size_t>(start - from), '\0');
    size_t got = 0;
    while (got < block.size()) {
      ssize_t n = ::pread(fd, &block[got], block.size() - got, from + static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    block.resize(got);
    newlines += static_cast<size_t>(std::count(block.begin(), block.end(), '\n'));
    tail.insert(0, block);
    start = from;
    if (got == 0) break;
    // A trailing newline ends the last line rather than starting another.
    size_t needed = count + (tail.back() == '\n' ? 1 : 0);
    if (newlines >= needed) break;
  }
  if (!tail.empty() && tail.back() == '\n') tail.pop_back();
  std::vector<std::string> segments;
  size_t from = 0;
  for (;;) {
    size_t nl = tail.find('\n', from);
    if (nl == std::string::npos) {
      segments.push_back(tail.substr(from));
      break;
    }
    segments.push_back(tail.substr(from, nl - from));
    from = nl + 1;
  }
  // Unless the file was read from its start, the first segment is the end of a longer line.
  size_t first = start > 0 ? 1 : 0;
  if (segments.size() - first > count) first = segments.size() - count;
  lines.assign(segments.begin() + static_cast<ptrdiff_t>(first), segments.end());
  return lines;
}

std::string writeJobTokenFile(const std::string& root, const std::string& folder,
                              const std::string& credential) {
  auto fail = [&](kj::StringPtr what, kj::StringPtr why) -> std::string {
    throwError(ErrorCode::FAILED, kj::str("cannot write the job credential: ", what, ": ", why));
  };
  // The folders above it must be this user's own and closed to others' writes, or someone
  // else could swap the file for theirs.
  for (auto& dir : {root, folder}) {
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0) return fail(dir, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
      return fail(dir, "not a folder of this user's that only it may write to");
    }
  }
  auto path = folder + "/job-token";
  ::unlink(path.c_str());  // one left by an earlier job of this name
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return fail(path, strerror(errno));
  KJ_DEFER(::close(fd));
  size_t done = 0;
  while (done < credential.size()) {
    ssize_t n = ::write(fd, credential.data() + done, credential.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(path, strerror(errno));
    done += static_cast<size_t>(n);
  }
  return path;
}

}  // namespace troupe::jobs_detail
