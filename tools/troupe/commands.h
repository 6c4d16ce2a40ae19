#pragma once
// The `troupe` command's subcommands, each a Command (cli.h) that runCommand() or
// runSubcommands() reads the arguments of and runs.

#include <kj/memory.h>

#include "tools/troupe/cli.h"

namespace troupe::cli {

kj::Own<Command> registryCommand();
kj::Own<Command> lsCommand();
kj::Own<Command> actorsCommand();
kj::Own<Command> callCommand();
kj::Own<Command> waitCommand();
kj::Own<Command> launchCommand();
kj::Own<Command> jobsCommand();
kj::Own<Command> topCommand();
kj::Own<Command> stopCommand();
kj::Own<Command> logsCommand();

}  // namespace troupe::cli
