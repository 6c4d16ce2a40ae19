// troupe-registry: the registry daemon on its own; the same as `troupe registry`.

#include "tools/troupe/commands.h"

int main(int argc, char** argv) { return troupe::cli::registryCommand("troupe-registry", argc, argv); }
