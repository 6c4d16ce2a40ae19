// troupe: the command-line tool. `troupe <command> --help` describes each command.

#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace {

const troupe::cli::Subcommand COMMANDS[] = {
    {"registry", "run the registry (the default resolver) in the foreground",
     troupe::cli::registryCommand},
    {"ls", "list endpoints, or watch them change (--watch)", troupe::cli::lsCommand},
    {"actors", "list the actors a server hosts, with their methods", troupe::cli::actorsCommand},
    {"call", "call an actor's method with JSON parameters; print the results as JSON",
     troupe::cli::callCommand},
    {"wait", "wait until N endpoints under a prefix are ready", troupe::cli::waitCommand},
    {"launch", "run a job of N replicas, on this machine or on Slurm, in the foreground",
     troupe::cli::launchCommand},
    {"jobs", "list the jobs the resolver knows (or, with --slurm, Slurm's queue)",
     troupe::cli::jobsCommand},
    {"stop", "stop a job: its launcher drains and ends it (the job's or an admin's token)",
     troupe::cli::stopCommand},
    {"logs", "print a job's replicas' output, from any machine (--follow for more)",
     troupe::cli::logsCommand},
    {"top", "show the endpoints under a prefix live: calls/s, latency, errors from /metrics",
     troupe::cli::topCommand},
};

constexpr const char* BRIEF =
    "The command-line tool of troupe, an actor runtime: runs the registry and jobs, finds "
    "endpoints and calls actors.";

constexpr const char* MORE =
    "Commands that talk to a resolver take --resolver URL, default $TROUPE_RESOLVER "
    "(registry://HOST:PORT, registry+unix:PATH, etcd://HOST:PORT, etcds://HOST:PORT, "
    "etcd+unix:PATH, fixed:NAME=ADDR,..., file:PATH).";

}  // namespace

int main(int argc, char** argv) {
  return troupe::cli::runSubcommands("troupe", BRIEF, MORE, COMMANDS, argc, argv);
}
