#pragma once
// Replicas' log files: created, appended to, and read back from the end.

#include <string>
#include <vector>

#include <kj/io.h>
#include <kj/string.h>

namespace troupe::jobs_detail {

// Creates `path` and its missing parents (mode 0700). Throws FAILED naming the path and the
// error when it cannot.
void makeDirectories(const std::string& path);

// Opens `path` for appending, creating it (mode 0644); with `truncate`, empties it first. The
// descriptor is close-on-exec (a child gets it only as the stdio it is handed). Throws FAILED
// naming the path and the error.
kj::AutoCloseFd openLog(const std::string& path, bool truncate);

// Appends `line` and a newline to the open log `fd`, in one write (so it does not interleave
// with a replica's own writes mid-line). Errors are ignored: a log line is not worth failing for.
void appendLine(int fd, kj::StringPtr line);

// The last `count` lines of the file at `path` (a last line without a newline counts), oldest
// first; empty when the file is missing. Reads only as much of the end as it needs.
std::vector<std::string> tailLines(const std::string& path, size_t count);

// Writes a job's credential to a new file "<folder>/job-token" (mode 0600, replacing one an
// earlier job left) and returns its path. `root` (the launcher's log directory) and `folder`
// (the job's, inside it) must be this user's and closed to others' writes, or someone else
// could swap the file for theirs. Throws FAILED naming what is wrong.
std::string writeJobTokenFile(const std::string& root, const std::string& folder,
                              const std::string& credential);

}  // namespace troupe::jobs_detail
