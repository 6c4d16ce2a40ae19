#pragma once
// Bare IPv4 TCP sockets for the benchmarks' no-RPC floors: a blocking connection, and a
// listening socket on a port the kernel picks.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>

#include <string>

#include <kj/debug.h>

namespace troupe::bench {

// A blocking TCP connection to "ipv4:port"; throws if it cannot connect.
inline int connectTcp(const std::string& hostPort) {
  auto colon = hostPort.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(hostPort.substr(colon + 1))));
  KJ_REQUIRE(inet_pton(AF_INET, hostPort.substr(0, colon).c_str(), &a.sin_addr) == 1,
             "not an IPv4 host:port", hostPort.c_str());
  int fd;
  KJ_SYSCALL(fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  KJ_SYSCALL(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)));
  return fd;
}

// A socket listening on IPv4 `host` at `port` (0: one the kernel picks); `port` is set to the
// port bound. Throws if it cannot listen.
inline int listenTcp(const std::string& host, uint16_t& port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  KJ_REQUIRE(inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1, "not an IPv4 host", host.c_str());
  int fd;
  KJ_SYSCALL(fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  KJ_SYSCALL(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)));
  KJ_SYSCALL(listen(fd, 1024));
  socklen_t length = sizeof(a);
  KJ_SYSCALL(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length));
  port = ntohs(a.sin_port);
  return fd;
}

}  // namespace troupe::bench
