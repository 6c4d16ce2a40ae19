// troupe-registry: the registry daemon on its own; the same as `troupe registry`.

#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

int main(int argc, char** argv) {
  auto command = troupe::cli::registryCommand();
  return troupe::cli::runCommand("troupe-registry", *command, argc, argv);
}
