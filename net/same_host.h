#pragma once
// Same host: what lets two processes of one user on one machine talk through a unix socket
// rather than loopback TCP (a small call is about 15 % faster, bench/README.md). A server
// publishes the path of its socket and sameHostId() in its endpoints' metadata; a client whose
// sameHostId() is the same, and that finds the socket its own user's, connects there.

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include <kj/common.h>
#include <kj/io.h>

namespace troupe {

// The metadata keys of an endpoint that can be reached through a unix socket on its host.
constexpr const char* SAME_HOST_SOCKET_KEY = "troupe.unix";  // the socket's path
constexpr const char* SAME_HOST_ID_KEY = "troupe.host";      // sameHostId() of its server

// This machine's boot and network namespace, as text two processes compare to know that a unix
// socket path means the same socket to both: the kernel's boot id (a new one at every boot, and
// per machine) and the network namespace's inode. Empty when /proc does not tell.
std::string sameHostId();

// The directory of this user's same-host sockets: $XDG_RUNTIME_DIR/troupe when that variable
// is set, else /tmp/troupe-<uid>. Made (mode 0700) when missing. Throws FAILED, saying why, when
// it exists but is not a directory that this user owns and only this user can enter (a symbolic
// link, another owner, group or other permissions): another user could then reach the sockets or
// put their own in their place.
std::string sameHostSocketDir();

// The name of a server's socket in that directory: "<incarnation in hex>-<pid>.sock". The
// incarnation tells a process's servers apart, the process id processes started in the same
// microsecond.
std::string sameHostSocketName(uint64_t incarnation);

// Removes the sockets in `dir` (sameHostSocketDir()) named by sameHostSocketName() whose process
// no longer runs: those of processes killed before they could remove theirs. Looks at no more
// than `most` entries. Returns how many it removed.
size_t removeStaleSockets(const std::string& dir, size_t most = 256);

// Where `fd` is a connected unix socket whose peer runs as this process's user: the process id
// of that peer, as the kernel recorded it when the connection was made (SO_PEERCRED, in this
// process's pid namespace; 0 where the peer is in none this process sees). Null otherwise.
kj::Maybe<pid_t> sameUserUnixPeer(int fd);

// The process of this user at the other end of a unix socket, held by a pidfd: while it is open
// its process id names that process and no other, even once it exited.
struct LocalPeer {
  pid_t pid = 0;          // in this process's pid namespace
  kj::AutoCloseFd pidfd;  // the process itself

  // Whether the process has exited.
  bool exited() const;
};

// The peer of `fd` (sameUserUnixPeer()), held as the kernel gave it for the connection
// (SO_PEERPIDFD) or, on kernels before 6.5, opened by its id now and checked alive; null where
// `fd` has no such peer, it is in another pid namespace, or no pidfd can be had (before 5.3).
std::shared_ptr<const LocalPeer> localPeerOf(int fd);

// Whether `path` is a unix socket owned by this process's user (not followed if a symbolic
// link).
bool isOwnSocket(const std::string& path);

}  // namespace troupe
