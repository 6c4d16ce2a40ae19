#pragma once
// A small simulated network for benchmarks that need one (on a single machine every process
// shares loopback, so a chain and a star look alike there): one network namespace per host, each
// joined to a bridge in a namespace of its own by a veth pair whose two ends are rate-limited
// (tc tbf) in both directions, as a host's link to a switch would be. Hosts get 10.77.0.<i+1>.
// Needs root (as CI has). Everything is created with names unique to this process ("trp<pid>")
// and removed when the object goes; blob_bench also removes it when interrupted (SIGINT,
// SIGTERM).

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::bench {

class SimulatedNetwork {
public:
  // `hosts` hosts, each link limited to `rate` (tc's syntax: "2gbit") with MTU `mtu`.
  SimulatedNetwork(int hosts, const std::string& rate, int mtu = 9000)
      : prefix("trp" + std::to_string(getpid())) {
    try {
      run("ip netns add " + sw());
      run("ip -n " + sw() + " link add br0 type bridge");
      run("ip -n " + sw() + " link set br0 up");
      for (int i = 0; i < hosts; ++i) addHost(i, rate, mtu);
    } catch (...) {
      teardown();
      throw;
    }
  }
  ~SimulatedNetwork() { teardown(); }
  SimulatedNetwork(const SimulatedNetwork&) = delete;
  SimulatedNetwork& operator=(const SimulatedNetwork&) = delete;

  // The namespace of host `i`, and its address.
  std::string ns(int i) const { return prefix + "h" + std::to_string(i); }
  static std::string ip(int i) { return "10.77.0." + std::to_string(i + 1); }
  int hosts() const { return static_cast<int>(names.size()); }

  // Moves the calling thread into host `i`'s namespace (sockets it makes from now on are
  // there); returns a descriptor of the namespace it was in, for leave().
  int enter(int i) const {
    int previous = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int target = open(("/var/run/netns/" + ns(i)).c_str(), O_RDONLY | O_CLOEXEC);
    if (previous < 0 || target < 0 || setns(target, CLONE_NEWNET) != 0) {
      throw std::runtime_error("cannot enter network namespace " + ns(i));
    }
    close(target);
    return previous;
  }
  static void leave(int previous) {
    setns(previous, CLONE_NEWNET);
    close(previous);
  }

  // Whether this process may build one (root, with ip and tc).
  static bool available() {
    return geteuid() == 0 && system("command -v ip >/dev/null && command -v tc >/dev/null") == 0;
  }

private:
  std::string sw() const { return prefix + "sw"; }

  void addHost(int i, const std::string& rate, int mtu) {
    auto host = ns(i);
    auto v = "v" + std::to_string(i);
    auto s = "s" + std::to_string(i);
    run("ip netns add " + host);
    names.push_back(host);
    run("ip link add " + v + " netns " + host + " mtu " + std::to_string(mtu) +
        " type veth peer name " + s + " netns " + sw() + " mtu " + std::to_string(mtu));
    run("ip -n " + host + " link set lo up");
    run("ip -n " + host + " addr add " + ip(i) + "/24 dev " + v);
    run("ip -n " + host + " link set " + v + " up");
    run("ip -n " + sw() + " link set " + s + " master br0");
    run("ip -n " + sw() + " link set " + s + " up");
    // Both directions of the link: out of the host, and out of the switch towards it.
    auto tbf = " root tbf rate " + rate + " burst 4mb latency 200ms";
    run("tc -n " + host + " qdisc add dev " + v + tbf);
    run("tc -n " + sw() + " qdisc add dev " + s + tbf);
  }

  void teardown() {
    for (auto& n : names) system(("ip netns del " + n + " 2>/dev/null").c_str());
    names.clear();
    system(("ip netns del " + sw() + " 2>/dev/null").c_str());
  }

  static void run(const std::string& command) {
    if (system((command + " >/dev/null").c_str()) != 0) {
      throw std::runtime_error("failed: " + command);
    }
  }

  std::string prefix;
  std::vector<std::string> names;
};

}  // namespace troupe::bench
