// troupe: the command-line tool. `troupe <command> --help` describes each command.

#include <stdio.h>
#include <string.h>

#include <string>

#include "tools/troupe/commands.h"

namespace {

constexpr const char* USAGE =
    "usage: troupe <command> [arguments]\n"
    "\n"
    "  registry   run the registry (the default resolver) in the foreground\n"
    "  ls         list endpoints, or watch them change (--watch)\n"
    "  actors     list the actors a server hosts, with their methods\n"
    "  call       call an actor's method with JSON parameters; print the results as JSON\n"
    "  wait       wait until N endpoints under a prefix are ready\n"
    "  launch     run a job of N replicas on this machine, in the foreground\n"
    "\n"
    "Commands that talk to a resolver take --resolver URL, default $TROUPE_RESOLVER\n"
    "(registry://HOST:PORT, registry+unix:PATH, fixed:NAME=ADDR,..., file:PATH).\n"
    "`troupe <command> --help` says more.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fputs(USAGE, stderr);
    return 2;
  }
  std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    fputs(USAGE, stdout);
    return 0;
  }
  // Each command sees argv from its own name on.
  int subArgc = argc - 1;
  char** subArgv = argv + 1;
  using namespace troupe::cli;
  if (command == "registry") return registryCommand("troupe registry", subArgc, subArgv);
  if (command == "ls") return lsCommand(subArgc, subArgv);
  if (command == "actors") return actorsCommand(subArgc, subArgv);
  if (command == "call") return callCommand(subArgc, subArgv);
  if (command == "wait") return waitCommand(subArgc, subArgv);
  if (command == "launch") return launchCommand(subArgc, subArgv);
  fprintf(stderr, "troupe: unknown command '%s'\n%s", command.c_str(), USAGE);
  return 2;
}
