#pragma once
// The `troupe` command's subcommands. Each takes its own argv (argv[0] is the subcommand's name)
// and returns the process's exit status: 0 done, 1 failed (said why on stderr), 2 bad usage.

namespace troupe::cli {

int registryCommand(const char* program, int argc, char** argv);
int lsCommand(int argc, char** argv);
int actorsCommand(int argc, char** argv);
int callCommand(int argc, char** argv);
int waitCommand(int argc, char** argv);
int launchCommand(int argc, char** argv);

}  // namespace troupe::cli
