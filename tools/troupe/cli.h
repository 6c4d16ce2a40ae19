#pragma once
// What the `troupe` subcommands share: flag parsing, the resolver they talk to, output that
// knows whether it goes to a terminal, and reporting failures.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/exception.h>
#include <kj/time.h>

#include "troupe/actor/endpoint.h"
#include "troupe/actor/event_loop.h"
#include "troupe/resolver/resolver.h"

namespace troupe::cli {

// Thrown for bad usage: the message is printed with the subcommand's usage, exit status 2.
struct UsageError {
  std::string message;
};

// A subcommand's arguments: flags (--name VALUE, --name=VALUE, or a bare --name for switches)
// and positional arguments; everything after "--" is positional.
class Args {
public:
  // `switches`: flags that take no value. `valued`: flags that take one. Anything else that
  // starts with "-" is a UsageError.
  Args(int argc, char** argv, const std::vector<std::string>& switches,
       const std::vector<std::string>& valued);

  bool has(const std::string& flag) const { return flags.count(flag) > 0; }
  std::string value(const std::string& flag, const std::string& otherwise = "") const;
  // The flag's value as a number; UsageError when it is not one (or is below `min`).
  uint64_t number(const std::string& flag, uint64_t otherwise, uint64_t min = 0) const;
  double decimal(const std::string& flag, double otherwise) const;

  std::vector<std::string> positional;
  bool sawDoubleDash = false;
  size_t positionalBeforeDoubleDash = 0;

private:
  std::map<std::string, std::string> flags;
};

// The resolver URL: --resolver, else $TROUPE_RESOLVER, else UsageError.
std::string resolverUrl(const Args& args);

// Whether standard output is a terminal (progress lines, colours, tables are for people).
bool stdoutIsTerminal();

// "3s", "5m12s", "2h03m", "4d"; "-" for 0 (the resolver did not say).
std::string formatAge(uint64_t registeredAtMillis);

// "tcp://..." and "unix:..." are addresses; anything else is an endpoint name or prefix.
bool isAddress(const std::string& text);

// Runs a subcommand's body, turning exceptions into a message on stderr and an exit status:
// UsageError -> `usage` and 2; a kj::Exception -> "troupe <name>: <description>" and 1.
int runCommand(const char* name, const char* usage, const std::function<int()>& body);

// The endpoints `target` names in `resolver`: the one named exactly `target` if there is one,
// else every endpoint whose name starts with it (a job's members, "ps/" or "ps/shard"). Fails
// with NO_ENDPOINTS when there are none.
kj::Promise<kj::Array<Endpoint>> endpointsNamed(Resolver& resolver, kj::StringPtr target);

}  // namespace troupe::cli
