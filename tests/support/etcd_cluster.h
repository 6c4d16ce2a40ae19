#pragma once
// EtcdCluster: real etcd members (the etcd binary, TROUPE_ETCD_PATH) in child processes, for
// tests of what runs on etcd. Every member listens on unix sockets only (no ports to race for)
// in one temporary directory, which goes with their data when the cluster goes. Members can be
// killed, frozen, thawed and restarted; a small blocking HTTP client speaks to etcd's JSON
// gateway (/v3/...) so that a test can look at, or change, what is stored behind the code it
// tests.
//
// Not thread-safe: use an EtcdCluster from one thread (the test's). Everything here blocks, for
// at most the bounds below; none of it needs an event loop, so it may be called between waits
// on one.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <kj/memory.h>
#include <kj/time.h>
#include <kj/vector.h>

namespace troupe::test {

// How long a member may take to say it is ready to serve clients after it was started (for a
// cluster, after all of them were started). Only a broken machine or etcd waits this long.
constexpr kj::Duration ETCD_START_TIMEOUT = 30 * kj::SECONDS;

// How long a member may take to exit after SIGTERM before it gets SIGKILL.
constexpr kj::Duration ETCD_STOP_TIMEOUT = 5 * kj::SECONDS;

// How long post() and the helpers built on it wait for a member's answer (a frozen member never
// answers; a member without a leader answers a write only when etcd's own timeout passes).
constexpr kj::Duration ETCD_REQUEST_TIMEOUT = 10 * kj::SECONDS;

// A second client listener on each member, speaking TLS on a loopback TCP port.
struct EtcdTls {
  std::string cert, key;  // the members' certificate (for 127.0.0.1 and localhost) and key
  std::string clientCa;   // when set, clients must present a certificate this CA signed
};

class EtcdCluster {
public:
  // Starts `members` etcd processes (named t1, t2, ...) forming one new cluster in a fresh
  // directory /tmp/troupe-etcd-XXXXXX, and returns once every one of them has logged that it
  // serves clients and has answered a request. Throws std::runtime_error, quoting what the
  // member logged last, when etcd cannot be started, exits, or is not ready within
  // ETCD_START_TIMEOUT; whatever it started is stopped and removed first.
  explicit EtcdCluster(size_t members = 1);

  // The same, each member also serving clients over TLS at tlsAddress(). The port is chosen
  // free and then handed to etcd (etcd's JSON gateway dials the address it was configured
  // with, so port 0 does not work): a start that finds it taken since is tried again with
  // another, three times at most.
  EtcdCluster(size_t members, EtcdTls tls);

  // Stops every running member, one after another (SIGTERM, then SIGKILL after
  // ETCD_STOP_TIMEOUT; SIGKILL at once for a frozen member, first), reaps each, and removes the
  // directory with the data and sockets.
  ~EtcdCluster();

  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Members, running or not. Members are numbered from 0.
  size_t size() const;

  // The directory holding every member's sockets and data.
  const std::string& directory() const;

  // The absolute path of the member's client socket ("<directory>/c1:1" for member 0: etcd takes
  // a unix socket only as "unix://NAME:PORT", relative to its working directory, so the path
  // has a colon in it). The socket is there while the member runs.
  std::string socketPath(size_t member) const;

  // The member's TLS listener, "tls://127.0.0.1:PORT". Throws std::logic_error for a cluster
  // started without EtcdTls.
  std::string tlsAddress(size_t member) const;

  // The URL a resolver is opened with: "etcd+unix:<socket 0>,<socket 1>,...?root=<root>", with
  // "&ttl_ms=<ttlMs>" when ttlMs > 0. Lists every member, running or not, in order.
  std::string url(const std::string& root = "troupe", size_t ttlMs = 0) const;

  // An HTTP reply: its status code (200 when etcd did what was asked; 400 and a JSON error
  // body for a refusal such as a compacted revision) and its body, un-chunked.
  struct Reply {
    int status = 0;
    std::string body;
  };

  // Sends "POST <path>" with the JSON body `json` to the member's client socket (HTTP/1.1,
  // Connection: close) and returns the whole reply. 64-bit numbers in etcd's JSON are strings,
  // keys and values are base64 (base64() below). Throws std::runtime_error when the member
  // cannot be reached (not running) or has not answered within ETCD_REQUEST_TIMEOUT.
  Reply post(size_t member, const std::string& path, const std::string& json) const;

  // Like post(), for a reply that streams (POST /v3/watch): returns as soon as `done` says yes
  // to the body received so far (called after each piece arrives), or when the member closes
  // the stream; closing the connection ends the stream. Throws as post() does, also when
  // ETCD_REQUEST_TIMEOUT passes before `done` said yes.
  Reply postUntil(size_t member, const std::string& path, const std::string& json,
                  const std::function<bool(const std::string& body)>& done) const;

  // Stores `value` under `key` (both raw bytes) through `member` and returns the revision of
  // the write. Throws std::runtime_error when etcd refuses or does not answer.
  int64_t put(const std::string& key, const std::string& value, size_t member = 0) const;

  // The value stored under `key` (a linearizable read through `member`); nullopt when there is
  // none. Throws like put().
  std::optional<std::string> get(const std::string& key, size_t member = 0) const;

  // The store's current revision, read (linearizably) from the header of a range request to the
  // first member that runs and is not frozen. Throws like put().
  int64_t revision() const;

  // Compacts the store's history up to `revision` (POST /v3/kv/compaction, waiting until it is
  // done on disk): a watch or read from an older revision is then refused as compacted. Throws
  // like put(), also when `revision` is compacted already or in the future.
  void compact(int64_t revision) const;

  // Sends SIGKILL to the member and reaps it. Its data stays (restart() brings it back); its
  // socket files stay too, as a crash leaves them. The others notice when their election
  // timeout passes: waitForLeader() waits for that.
  void kill(size_t member);

  // Sends SIGSTOP and returns once the member has stopped; it answers nothing until thaw().
  // Throws std::runtime_error when it has exited instead (it is reaped then).
  void freeze(size_t member);

  // Sends SIGCONT to a frozen member: it runs on where it stopped.
  void thaw(size_t member);

  // Starts the member again with the data it had (stopping it first if it runs: with SIGTERM,
  // or SIGKILL when it is frozen), as a member of the existing cluster, and returns once it serves
  // clients again (it logged so and answered). A member of a larger cluster is ready only once it
  // reached a quorum of the others. Throws like the constructor.
  void restart(size_t member);

  // For a one-member cluster: stops it (SIGTERM), removes its data and starts a new cluster on
  // the same socket, as an etcd that restarted without its data would be: empty, at revision
  // 1, with none of the old leases. Returns once it serves clients. Throws std::logic_error for
  // a larger cluster, and like the constructor.
  void restartEmpty();

  // Returns the leader once the members that run and are not frozen agree on one among them,
  // as their logs say (etcd's raft logs every leader it learns of or loses), and each of them
  // has answered a linearizable read: after kill() or freeze() of the leader, once the others
  // have elected a new one; after thaw() of an old leader, once it follows the new one. Waits on
  // their log lines and replies, not on a clock; throws std::runtime_error when they do not
  // agree, or refuse reads, past ETCD_START_TIMEOUT.
  size_t waitForLeader() const;

  // The member's process id; -1 when it does not run.
  pid_t pid(size_t member) const;

  // Whether the member's process runs (frozen or not).
  bool running(size_t member) const;

  // Whether the member is frozen (freeze() without thaw()).
  bool frozen(size_t member) const;

  struct Member;
  struct Logs;

private:
  void makeDirectory(size_t members);
  void startAll();
  void start(size_t member, bool newCluster);
  void awaitReady(const kj::Vector<size_t>& started);
  void stop(size_t member, int signal);
  void stopAll();
  Member& at(size_t member);
  const Member& at(size_t member) const;
  size_t firstServing() const;
  std::optional<size_t> agreedLeader() const;           // under Logs::mutex
  bool leadsWithAStoppedPeerUp(const Member& m) const;  // under Logs::mutex

  std::string dir;
  std::optional<EtcdTls> tls;
  kj::Own<Logs> logs;
  kj::Vector<kj::Own<Member>> members;
};

// `bytes` in base64, as etcd's JSON gateway carries keys and values.
std::string base64(const std::string& bytes);

// The bytes `text` encodes in base64; throws std::runtime_error when it is not base64.
std::string unbase64(const std::string& text);

// The first string value of `"<field>":"..."` in the JSON `json` (etcd's replies have no
// escaped quotes in the fields this is for: numbers, ids, base64); nullopt when there is none.
std::optional<std::string> jsonString(const std::string& json, const std::string& field);

}  // namespace troupe::test
