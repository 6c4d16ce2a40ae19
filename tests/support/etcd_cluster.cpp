#include "tests/support/etcd_cluster.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <kj/encoding.h>

#include "tests/support/child_process.h"

#ifndef TROUPE_ETCD_PATH
#define TROUPE_ETCD_PATH "/usr/bin/etcd"
#endif

namespace troupe::test {

// What the members' log readers share with the test's thread: one lock and one condition for
// all of them, notified at every line any member logs and when one exits.
struct EtcdCluster::Logs {
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
};

struct EtcdCluster::Member {
  std::string name;               // "t1"
  std::string client;             // "c1:1", the client socket, relative to the cluster's directory
  std::string peer;               // "p1:1"
  std::string dataDir;            // absolute
  kj::Own<ChildProcess> process;  // null when it does not run
  std::thread reader;             // reads `process`'s output while it runs
  bool frozen = false;

  // Written by `reader`, under Logs::mutex.
  std::deque<std::string> tail;  // the last lines it logged, for error messages
  uint16_t tlsPort = 0;          // its TLS client listener's (EtcdTls)
  int listeners = 1;             // client listeners it serves: 2 with TLS

  bool ready = false;                 // it logged that it serves clients on every listener
  int serving = 0;                    // client listeners it logged it serves
  bool exited = false;                // its output ended and it exited (not yet reaped, perhaps)
  std::string self;                   // its raft id (hex), from its log lines
  std::string leader;                 // the leader it last logged (hex); "" when it has none
  std::set<std::string> activePeers;  // the peers its transport counts as up (hex ids)
};

namespace {

using Clock = std::chrono::steady_clock;

// etcd logs this (zap's "msg") once its client listener serves, which it does only after the
// member has joined the cluster (etcdserver's ReadyNotify). "serving client traffic insecurely"
// for our plain unix sockets.
constexpr const char* READY_LINE = "serving client traffic";
constexpr size_t TAIL_LINES = 40;

std::chrono::nanoseconds toChrono(kj::Duration d) {
  return std::chrono::nanoseconds(d / kj::NANOSECONDS);
}

// Whether `pid` has exited, without reaping it (ChildProcess::wait() does that later). True
// also when it was reaped already (by ChildProcess::freeze(), which may find an exit).
bool hasExited(pid_t pid) {
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
  return info.si_pid == pid;
}

// A loopback TCP port that was free a moment ago: bound to port 0, read back, closed.
uint16_t freeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    int error = errno;
    ::close(fd);
    throw std::runtime_error(std::string("binding a loopback port: ") + strerror(error));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

// The string value of `"<field>":"..."` in a log line; "" when it has none.
std::string logField(const std::string& line, const char* field) {
  return jsonString(line, field).value_or("");
}

// Follows the leader a member's raft reports in its log: "raft.node: <self> elected leader
// <id> at term <n>", "... changed leader from <id> to <id> at term <n>", "... lost leader
// <id> at term <n>".
void noteRaft(EtcdCluster::Member& m, const std::string& line) {
  auto at = line.find("raft.node: ");
  if (at == std::string::npos) return;
  std::istringstream words(line.substr(at + strlen("raft.node: ")));
  std::string self, verb, word, id;
  words >> self >> verb >> word;
  if (verb == "elected" && word == "leader") {
    words >> id;
  } else if (verb == "changed" && word == "leader") {
    std::string from, old, to;
    words >> from >> old >> to >> id;
  } else if (verb == "lost" && word == "leader") {
    id = "";
  } else {
    return;
  }
  m.self = self;
  m.leader = id;
}

// What one line of a member's log tells: that it serves clients, its id, its leader, and
// which peers its transport counts as up ("peer became active", "peer became inactive ...":
// a peer that exits stays active until a message to it fails).
void noteLine(EtcdCluster::Member& m, const std::string& line) {
  if (line.find(READY_LINE) != std::string::npos && ++m.serving >= m.listeners) m.ready = true;
  if (m.self.empty()) m.self = logField(line, "local-member-id");
  noteRaft(m, line);
  if (line.find("\"msg\":\"peer became active") != std::string::npos) {
    m.activePeers.insert(logField(line, "peer-id"));
  } else if (line.find("\"msg\":\"peer became inactive") != std::string::npos) {
    m.activePeers.erase(logField(line, "peer-id"));
  }
}

// Reads a member's output until it exits, so that etcd never blocks on a full pipe, keeping
// what waits need (readiness, leader, the last lines) in `m`.
void readLog(ChildProcess& process, EtcdCluster::Member& m, EtcdCluster::Logs& logs) {
  auto keep = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(logs.mutex);
    m.tail.push_back(line);
    if (m.tail.size() > TAIL_LINES) m.tail.pop_front();
    noteLine(m, line);
    logs.changed.notify_all();
  };
  for (;;) {
    // "" is a timeout or the end of output (etcd never logs an empty line).
    std::string line = process.readLine(1000);
    if (!line.empty()) {
      keep(line);
      continue;
    }
    if (!hasExited(process.pid())) continue;
    // What it wrote last may still be in the pipe; the end of its output is there now.
    while (!(line = process.readLine(1000)).empty()) keep(line);
    break;
  }
  std::lock_guard<std::mutex> lock(logs.mutex);
  m.exited = true;
  logs.changed.notify_all();
}

std::string lastLines(const EtcdCluster::Member& m) {
  std::string out;
  size_t skip = m.tail.size() > 8 ? m.tail.size() - 8 : 0;
  for (size_t i = skip; i < m.tail.size(); ++i) out += "\n  " + m.tail[i];
  return out.empty() ? " (nothing)" : out;
}

// A unix socket, closed when this goes.
struct Socket {
  int fd = -1;
  ~Socket() {
    if (fd >= 0) close(fd);
  }
};

// Connects `s` (non-blocking) to the unix socket at `path`.
void connectUnix(Socket& s, const std::string& path, const std::string& where) {
  s.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s.fd < 0) throw std::runtime_error(std::string("socket: ") + strerror(errno));
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) throw std::runtime_error("path too long: " + where);
  memcpy(addr.sun_path, path.c_str(), path.size());
  if (connect(s.fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    // A unix socket connects at once or not at all (EAGAIN: its backlog is full).
    throw std::runtime_error("cannot connect (" + std::string(strerror(errno)) + "): " + where);
  }
}

// Waits until `fd` is ready for `events` or `deadline` passes; false on the deadline.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    struct pollfd p = {fd, events, 0};
    int n = poll(&p, 1, static_cast<int>(left.count()) + 1);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + strerror(errno));
  }
}

// The body of an HTTP reply whose head ends before `from`; true once it is complete.
bool decodeBody(const std::string& raw, size_t from, bool chunked,
                std::optional<size_t> contentLength, std::string& body) {
  body.clear();
  if (!chunked) {
    if (!contentLength) {
      body = raw.substr(from);
      return false;  // complete at the end of the stream
    }
    body = raw.substr(from, *contentLength);
    return raw.size() - from >= *contentLength;
  }
  size_t pos = from;
  for (;;) {
    auto eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    size_t size = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);  // ";ext" stops it
    if (size == 0) return true;  // trailers follow; nothing we need
    if (raw.size() < eol + 2 + size + 2) {
      body.append(raw, eol + 2, std::min(size, raw.size() - (eol + 2)));
      return false;
    }
    body.append(raw, eol + 2, size);
    pos = eol + 2 + size + 2;
  }
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return s;
}

// What the head of an HTTP reply says about its body.
struct Head {
  int status = 0;
  size_t bodyStart = 0;
  bool chunked = false;
  std::optional<size_t> contentLength;
};

// The head of the reply that `raw` starts with; nullopt while it is incomplete.
std::optional<Head> parseHead(const std::string& raw, const std::string& where) {
  auto end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return std::nullopt;
  auto head = lower(raw.substr(0, end + 2));
  if (head.rfind("http/1.", 0) != 0) throw std::runtime_error("not HTTP: " + where);
  Head out;
  out.status = std::stoi(head.substr(head.find(' ') + 1));
  out.bodyStart = end + 4;
  out.chunked = head.find("\r\ntransfer-encoding: chunked\r\n") != std::string::npos;
  auto length = head.find("\r\ncontent-length:");
  if (length != std::string::npos) {
    out.contentLength = std::stoul(head.substr(length + strlen("\r\ncontent-length:")));
  }
  return out;
}

// POST `json` to `path` over the unix socket at `socketPath`; returns when the reply is complete,
// the server closes, or `done` accepts the body so far.
EtcdCluster::Reply exchange(const std::string& socketPath, const std::string& path,
                            const std::string& json,
                            const std::function<bool(const std::string&)>& done) {
  auto where = "POST " + path + " to " + socketPath;
  auto deadline = Clock::now() + toChrono(ETCD_REQUEST_TIMEOUT);
  Socket s;
  connectUnix(s, socketPath, where);
  std::string request = "POST " + path + " HTTP/1.1\r\nHost: etcd\r\n" +
                        "Content-Type: application/json\r\nContent-Length: " +
                        std::to_string(json.size()) + "\r\nConnection: close\r\n\r\n" + json;
  for (size_t sent = 0; sent < request.size();) {
    if (!waitFor(s.fd, POLLOUT, deadline)) throw std::runtime_error("timed out sending: " + where);
    ssize_t n = send(s.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) throw std::runtime_error("send (" + std::string(strerror(errno)) + "): " + where);
    sent += static_cast<size_t>(n);
  }

  std::string raw;
  std::optional<Head> head;
  EtcdCluster::Reply reply;
  for (;;) {
    if (!waitFor(s.fd, POLLIN, deadline)) {
      throw std::runtime_error("no answer within " +
                               std::to_string(ETCD_REQUEST_TIMEOUT / kj::MILLISECONDS) +
                               " ms: " + where);
    }
    char chunk[16384];
    ssize_t n = recv(s.fd, chunk, sizeof(chunk), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) throw std::runtime_error("recv (" + std::string(strerror(errno)) + "): " + where);
    raw.append(chunk, static_cast<size_t>(n));
    if (!head) head = parseHead(raw, where);
    if (!head) {
      if (n == 0) throw std::runtime_error("connection closed without a reply: " + where);
      continue;
    }
    reply.status = head->status;
    bool complete = decodeBody(raw, head->bodyStart, head->chunked, head->contentLength,
                               reply.body);
    if (complete || n == 0 || (done && done(reply.body))) return reply;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

EtcdCluster::EtcdCluster(size_t count) : logs(kj::heap<Logs>()) {
  if (count == 0) throw std::logic_error("an etcd cluster needs a member");
  makeDirectory(count);
  startAll();
}

EtcdCluster::EtcdCluster(size_t count, EtcdTls tlsIn)
    : tls(std::move(tlsIn)), logs(kj::heap<Logs>()) {
  if (count == 0) throw std::logic_error("an etcd cluster needs a member");
  for (int attempt = 1;; ++attempt) {
    makeDirectory(count);
    for (auto& m : members) {
      m->tlsPort = freeLoopbackPort();
      m->listeners = 2;
    }
    try {
      startAll();
      return;
    } catch (const std::runtime_error& e) {
      bool taken = std::string(e.what()).find("address already in use") != std::string::npos;
      if (attempt >= 3 || !taken) {
        throw;
      }
    }
  }
}

void EtcdCluster::makeDirectory(size_t count) {
  if (access(TROUPE_ETCD_PATH, X_OK) != 0) {
    throw std::runtime_error(std::string("no etcd at ") + TROUPE_ETCD_PATH +
                             " (Debian's etcd-server; scripts/setup.sh installs it)");
  }
  char templ[] = "/tmp/troupe-etcd-XXXXXX";
  if (mkdtemp(templ) == nullptr) {
    throw std::runtime_error(std::string("mkdtemp: ") + strerror(errno));
  }
  dir = templ;
  members.clear();
  for (size_t i = 0; i < count; ++i) {
    auto m = kj::heap<Member>();
    auto n = std::to_string(i + 1);
    m->name = "t" + n;
    m->client = "c" + n + ":1";
    m->peer = "p" + n + ":1";
    m->dataDir = dir + "/data" + n;
    members.add(kj::mv(m));
  }
}

void EtcdCluster::startAll() {
  try {
    kj::Vector<size_t> started;
    for (size_t i = 0; i < members.size(); ++i) {
      start(i, true);
      started.add(i);
    }
    awaitReady(started);
  } catch (...) {
    stopAll();
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    throw;
  }
}

EtcdCluster::~EtcdCluster() {
  try {
    stopAll();
  } catch (const std::exception& e) {
    std::cerr << "EtcdCluster: stopping " << dir << ": " << e.what() << std::endl;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

size_t EtcdCluster::size() const { return members.size(); }

const std::string& EtcdCluster::directory() const { return dir; }

const EtcdCluster::Member& EtcdCluster::at(size_t member) const {
  if (member >= members.size()) {
    throw std::out_of_range("no etcd member " + std::to_string(member) + " in a cluster of " +
                            std::to_string(members.size()));
  }
  return *members[member];
}

EtcdCluster::Member& EtcdCluster::at(size_t member) {
  return const_cast<Member&>(static_cast<const EtcdCluster&>(*this).at(member));
}

std::string EtcdCluster::socketPath(size_t member) const { return dir + "/" + at(member).client; }

std::string EtcdCluster::tlsAddress(size_t member) const {
  if (!tls) throw std::logic_error("this etcd cluster was started without TLS");
  return "tls://127.0.0.1:" + std::to_string(at(member).tlsPort);
}

std::string EtcdCluster::url(const std::string& root, size_t ttlMs) const {
  std::string out = "etcd+unix:";
  for (size_t i = 0; i < members.size(); ++i) out += (i == 0 ? "" : ",") + socketPath(i);
  out += "?root=" + root;
  if (ttlMs > 0) out += "&ttl_ms=" + std::to_string(ttlMs);
  return out;
}

void EtcdCluster::start(size_t member, bool newCluster) {
  auto& m = at(member);
  if (m.process) throw std::logic_error("etcd member " + m.name + " runs already");
  // etcd refuses to listen on a socket file that is there already, as a killed member leaves.
  ::unlink((dir + "/" + m.client).c_str());
  ::unlink((dir + "/" + m.peer).c_str());
  std::string initialCluster;
  for (auto& other : members) {
    initialCluster += (initialCluster.empty() ? "" : ",") + other->name + "=unix://" + other->peer;
  }
  std::string clientUrls = "unix://" + m.client;
  if (tls) clientUrls += ",https://127.0.0.1:" + std::to_string(m.tlsPort);
  std::vector<std::string> args{
      "--name", m.name, "--data-dir", m.dataDir, "--listen-client-urls", clientUrls,
      "--advertise-client-urls", "unix://" + m.client, "--listen-peer-urls", "unix://" + m.peer,
      "--initial-advertise-peer-urls", "unix://" + m.peer, "--initial-cluster", initialCluster,
      "--initial-cluster-state", newCluster ? "new" : "existing",
      // JSON lines on stdout (etcd 3.4 logs with capnslog to stderr unless told otherwise).
      "--logger=zap", "--log-outputs=stdout"};
  if (tls) {
    for (auto& arg : std::vector<std::string>{"--cert-file", tls->cert, "--key-file", tls->key}) {
      args.push_back(arg);
    }
    if (!tls->clientCa.empty()) {
      for (auto& arg :
           std::vector<std::string>{"--trusted-ca-file", tls->clientCa, "--client-cert-auth"}) {
        args.push_back(arg);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(logs->mutex);
    m.tail.clear();
    m.ready = m.exited = false;
    m.serving = 0;
    m.self.clear();
    m.leader.clear();
    m.activePeers.clear();
  }
  m.process = kj::heap<ChildProcess>(TROUPE_ETCD_PATH, args, std::vector<std::string>{},
                                     ChildProcessOptions{.workingDirectory = dir,
                                                         .stderrToStdout = true});
  m.frozen = false;
  m.reader = std::thread(readLog, std::ref(*m.process), std::ref(m), std::ref(*logs));
}

void EtcdCluster::awaitReady(const kj::Vector<size_t>& started) {
  auto deadline = Clock::now() + toChrono(ETCD_START_TIMEOUT);
  {
    std::unique_lock<std::mutex> lock(logs->mutex);
    for (auto i : started) {
      auto& m = at(i);
      logs->changed.wait_until(lock, deadline, [&]() { return m.ready || m.exited; });
      if (!m.ready) {
        throw std::runtime_error(
            "etcd member " + m.name +
            (m.exited ? " exited before it served clients" : " did not serve clients in time") +
            " (in " + dir + "); it logged last:" + lastLines(m));
      }
    }
  }
  // Logged just after its listener started serving: one answer through the JSON gateway shows
  // that the whole path works.
  for (auto i : started) {
    auto reply = post(i, "/v3/maintenance/status", "{}");
    if (reply.status != 200) {
      throw std::runtime_error("etcd member " + at(i).name + " answered its first request with " +
                               std::to_string(reply.status) + ": " + reply.body);
    }
  }
}

void EtcdCluster::stop(size_t member, int signal) {
  auto& m = at(member);
  if (!m.process) return;
  if (m.frozen) {
    // Thawed to act on SIGTERM, it would first catch up on what it missed (a leader that was
    // frozen tries to hand its leadership over and waits seconds for that to fail). SIGKILL
    // stops it where it stands.
    signal = SIGKILL;
    m.process->thaw();
    m.frozen = false;
  }
  if (signal == SIGTERM) {
    // A leader sent SIGTERM first hands its leadership to the peer connected longest, and one
    // that has exited may still count as connected: it then waits seconds for the handover
    // to fail. Its heartbeats find out within a heartbeat interval; wait for that.
    std::unique_lock<std::mutex> lock(logs->mutex);
    logs->changed.wait_for(lock, toChrono(ETCD_STOP_TIMEOUT),
                           [&]() { return !leadsWithAStoppedPeerUp(m); });
  }
  m.process->kill(signal);
  {
    std::unique_lock<std::mutex> lock(logs->mutex);
    if (!logs->changed.wait_for(lock, toChrono(ETCD_STOP_TIMEOUT), [&]() { return m.exited; })) {
      std::cerr << "EtcdCluster: etcd member " << m.name << " did not exit within "
                << ETCD_STOP_TIMEOUT / kj::MILLISECONDS << " ms of signal " << signal
                << "; killing it. It logged last:" << lastLines(m) << std::endl;
      m.process->kill(SIGKILL);
      logs->changed.wait(lock, [&]() { return m.exited; });  // SIGKILL cannot be refused
    }
  }
  m.reader.join();
  m.process->wait(static_cast<int>(ETCD_STOP_TIMEOUT / kj::MILLISECONDS));  // reaps it
  m.process = nullptr;
}

bool EtcdCluster::leadsWithAStoppedPeerUp(const Member& m) const {
  if (m.self.empty() || m.leader != m.self) return false;
  for (auto& other : members) {
    if (!other->process && other->self.size() > 0 && m.activePeers.count(other->self) > 0) {
      return true;
    }
  }
  return false;
}

void EtcdCluster::stopAll() {
  // Frozen members first (SIGKILL), so that no leader tries to hand its leadership to one.
  // Then one at a time, followers before leaders: members sent SIGTERM together each wait for
  // the others and take seconds to exit, and a follower exits at once (tens of milliseconds),
  // handing nothing over.
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i]->frozen) stop(i, SIGKILL);
  }
  for (bool leaders : {false, true}) {
    for (size_t i = 0; i < members.size(); ++i) {
      bool leads;
      {
        std::lock_guard<std::mutex> lock(logs->mutex);
        leads = members[i]->leader == members[i]->self;
      }
      if (leads == leaders) stop(i, SIGTERM);
    }
  }
}

EtcdCluster::Reply EtcdCluster::post(size_t member, const std::string& path,
                                     const std::string& json) const {
  return exchange(socketPath(member), path, json, nullptr);
}

EtcdCluster::Reply EtcdCluster::postUntil(
    size_t member, const std::string& path, const std::string& json,
    const std::function<bool(const std::string& body)>& done) const {
  return exchange(socketPath(member), path, json, done);
}

namespace {

EtcdCluster::Reply checked(const EtcdCluster& cluster, size_t member, const std::string& path,
                           const std::string& json) {
  auto reply = cluster.post(member, path, json);
  if (reply.status != 200) {
    throw std::runtime_error("etcd member " + std::to_string(member) + " refused POST " + path +
                             " " + json + ": " + std::to_string(reply.status) + " " + reply.body);
  }
  return reply;
}

int64_t headerRevision(const EtcdCluster::Reply& reply) {
  auto revision = jsonString(reply.body, "revision");
  if (!revision) throw std::runtime_error("etcd's reply has no revision: " + reply.body);
  return std::stoll(*revision);
}

}  // namespace

int64_t EtcdCluster::put(const std::string& key, const std::string& value, size_t member) const {
  return headerRevision(
      checked(*this, member, "/v3/kv/put",
              "{\"key\":\"" + base64(key) + "\",\"value\":\"" + base64(value) + "\"}"));
}

std::optional<std::string> EtcdCluster::get(const std::string& key, size_t member) const {
  auto reply = checked(*this, member, "/v3/kv/range", "{\"key\":\"" + base64(key) + "\"}");
  if (reply.body.find("\"kvs\":") == std::string::npos) return std::nullopt;
  auto value = jsonString(reply.body, "value");  // etcd leaves an empty value out
  return value ? unbase64(*value) : std::string();
}

size_t EtcdCluster::firstServing() const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i]->process && !members[i]->frozen) return i;
  }
  throw std::runtime_error("no etcd member runs");
}

int64_t EtcdCluster::revision() const {
  // Any key does: the header carries the revision, whether the key is there or not.
  return headerRevision(checked(*this, firstServing(), "/v3/kv/range",
                                "{\"key\":\"" + base64(std::string(1, '\0')) + "\"}"));
}

void EtcdCluster::compact(int64_t revision) const {
  checked(*this, firstServing(), "/v3/kv/compaction",
          "{\"revision\":\"" + std::to_string(revision) + "\",\"physical\":true}");
}

void EtcdCluster::kill(size_t member) { stop(member, SIGKILL); }

void EtcdCluster::freeze(size_t member) {
  auto& m = at(member);
  if (!m.process) throw std::logic_error("etcd member " + m.name + " does not run");
  if (m.process->freeze()) {
    m.frozen = true;
    return;
  }
  // It had exited, and freeze() reaped it: its reader ends at once.
  m.reader.join();
  m.process = nullptr;
  throw std::runtime_error("etcd member " + m.name + " had exited; it logged last:" + lastLines(m));
}

void EtcdCluster::thaw(size_t member) {
  auto& m = at(member);
  if (!m.process) return;
  m.process->thaw();
  m.frozen = false;
}

void EtcdCluster::restart(size_t member) {
  stop(member, SIGTERM);
  start(member, false);
  kj::Vector<size_t> started;
  started.add(member);
  awaitReady(started);
}

void EtcdCluster::restartEmpty() {
  if (members.size() != 1) {
    throw std::logic_error("restartEmpty() is for a one-member cluster; this has " +
                           std::to_string(members.size()));
  }
  stop(0, SIGTERM);
  std::filesystem::remove_all(members[0]->dataDir);
  start(0, true);
  kj::Vector<size_t> started;
  started.add(0);
  awaitReady(started);
}

std::optional<size_t> EtcdCluster::agreedLeader() const {
  std::optional<size_t> leader;
  const std::string* id = nullptr;
  for (size_t i = 0; i < members.size(); ++i) {
    auto& m = *members[i];
    if (!m.process || m.frozen) continue;
    if (m.leader.empty() || (id != nullptr && m.leader != *id)) return std::nullopt;
    id = &m.leader;
    if (m.self == m.leader) leader = i;
  }
  return leader;
}

size_t EtcdCluster::waitForLeader() const {
  auto deadline = Clock::now() + toChrono(ETCD_START_TIMEOUT);
  std::string refusal;
  for (;;) {
    std::optional<size_t> leader;
    {
      std::unique_lock<std::mutex> lock(logs->mutex);
      logs->changed.wait_until(lock, deadline, [&]() {
        leader = agreedLeader();
        return leader.has_value();
      });
      if (!leader) {
        std::string views;
        for (auto& m : members) {
          views += " " + m->name + (m->process ? (m->frozen ? " (frozen)" : "") : " (down)") +
                   " follows '" + m->leader + "';";
        }
        throw std::runtime_error("the etcd members did not agree on a leader in time:" + views +
                                 (refusal.empty() ? "" : " last refusal: " + refusal));
      }
    }
    // Raft logs a new leader a little before etcd's server has taken it in; until then that
    // member refuses reads with "leader changed". One read through each shows that each has.
    bool served = true;
    for (size_t i = 0; i < members.size() && served; ++i) {
      if (!members[i]->process || members[i]->frozen) continue;
      auto reply = post(i, "/v3/kv/range", "{\"key\":\"" + base64(std::string(1, '\0')) + "\"}");
      if (reply.status != 200) {
        served = false;
        refusal = reply.body;
      }
    }
    if (served) return *leader;
    if (Clock::now() >= deadline) {
      throw std::runtime_error("the etcd members agree on a leader but refuse reads: " + refusal);
    }
  }
}

pid_t EtcdCluster::pid(size_t member) const {
  auto& m = at(member);
  return m.process ? m.process->pid() : -1;
}

bool EtcdCluster::running(size_t member) const { return at(member).process.get() != nullptr; }

bool EtcdCluster::frozen(size_t member) const { return at(member).frozen; }

// ---------------------------------------------------------------------------------------------

std::string base64(const std::string& bytes) {
  auto encoded = kj::encodeBase64(
      kj::arrayPtr(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()));
  return std::string(encoded.cStr(), encoded.size());
}

std::string unbase64(const std::string& text) {
  auto decoded = kj::decodeBase64(kj::arrayPtr(text.data(), text.size()));
  if (decoded.hadErrors) throw std::runtime_error("not base64: '" + text + "'");
  return std::string(reinterpret_cast<const char*>(decoded.begin()), decoded.size());
}

std::optional<std::string> jsonString(const std::string& json, const std::string& field) {
  auto key = "\"" + field + "\":\"";
  auto at = json.find(key);
  if (at == std::string::npos) return std::nullopt;
  auto begin = at + key.size();
  auto end = json.find('"', begin);
  if (end == std::string::npos) return std::nullopt;
  return json.substr(begin, end - begin);
}

}  // namespace troupe::test
