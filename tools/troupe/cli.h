#pragma once
// What the `troupe` subcommands share: reading their arguments with kj::MainBuilder, the
// resolver they talk to, output that knows whether it goes to a terminal, and reporting failures.
//
// Exit statuses, for every command: 0 done, 1 failed (said why on stderr as
// "troupe <command>: <message>"), 2 bad usage (the message, then the command's usage, on
// stderr). `--help` prints the usage on stdout and exits 0; `--version` prints troupe's version.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/function.h>
#include <kj/main.h>
#include <kj/string.h>
#include <kj/time.h>

#include "troupe/actor/endpoint.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/resolver.h"

namespace troupe::cli {

// "troupe 0.2.0": what --version prints.
extern const char* const VERSION_TEXT;

// Thrown for bad usage, while the arguments are read or after: the message is printed with the
// command's usage, exit status 2.
struct UsageError {
  std::string message;
};

// A subcommand: the options and arguments it takes, declared on a kj::MainBuilder, and what it
// does with them once they are read. Its parser's callbacks write into the command, which must
// outlive the parser.
class Command {
public:
  virtual ~Command() noexcept(false) = default;

  // Declares the command's options and arguments on a MainBuilder made with `context` and returns
  // the parser it builds. Called again (and run with "--help") to print the usage after a usage
  // error. The callbacks may throw UsageError for a bad value.
  virtual kj::MainFunc parser(kj::ProcessContext& context) = 0;

  // Does the command's work once its arguments were read; returns the exit status. Throws
  // UsageError for bad usage found only now, kj::Exception for a failure.
  virtual int run() = 0;
};

// Runs `command` as the whole program, named `programName` in messages and usage
// ("troupe-registry"): reads argv[1...] with its parser, then runs it. Returns the exit status.
int runCommand(kj::StringPtr programName, Command& command, int argc, char** argv);

// One subcommand of a program of subcommands: its name, a line of help, and how to make it.
struct Subcommand {
  kj::StringPtr name;
  kj::StringPtr brief;
  kj::Own<Command> (*make)();
};

// Runs a program of subcommands (`troupe`): argv[1] names the subcommand, which reads the rest.
// `programName --help` prints `brief`, the subcommands, the options, then `more`. An unknown or
// missing subcommand is bad usage. Returns the exit status.
int runSubcommands(kj::StringPtr programName, kj::StringPtr brief, kj::StringPtr more,
                   kj::ArrayPtr<const Subcommand> subcommands, int argc, char** argv);

// An option or argument callback for kj::MainBuilder that keeps the text in `out`, which must
// outlive the parse.
kj::Function<kj::MainBuilder::Validity(kj::StringPtr)> storeIn(std::string& out);

// Value parsers for option callbacks; each throws UsageError naming `flag` and the bad text
// ("--count needs a whole number of at least 1, not 'x'").
uint64_t parseWhole(kj::StringPtr flag, kj::StringPtr text, uint64_t min = 0);
// A number of cores: a decimal, 0 or more.
double parseCores(kj::StringPtr flag, kj::StringPtr text);
// A duration, the one format every flag takes: a decimal and its unit, ms, s, m or h ("500ms",
// "30s", "1.5m", "2h"), in whole milliseconds (cut down), from `min` to `max`. Throws UsageError
// naming `flag`, the format and the bounds.
kj::Duration parseDuration(kj::StringPtr flag, kj::StringPtr text,
                           kj::Duration min = 1 * kj::MILLISECONDS,
                           kj::Duration max = 1000000 * kj::HOURS);
// `duration` as parseDuration() reads it, in the largest unit that keeps it whole ("500ms",
// "30s", "2m", "1500ms").
kj::String durationText(kj::Duration duration);

// The TLS and token flags every command takes, each standing for the environment variable of the
// same meaning (Credentials::fromEnvironment): --tls-ca FILE (TROUPE_TLS_CA), --tls-cert FILE
// (TROUPE_TLS_CERT), --tls-key FILE (TROUPE_TLS_KEY), --token-file FILE (TROUPE_TOKEN_FILE),
// and for servers --tls-require-client-cert (TROUPE_TLS_REQUIRE_CLIENT_CERT=1). A token is never
// a flag's value: it would show in the process list.
struct CredentialFlags {
  // Declares the flags on `builder`, which it returns.
  kj::MainBuilder& addTo(kj::MainBuilder& builder, bool server = false);

  // The credentials of this command: the environment's (Credentials::fromEnvironment), with
  // what the flags say in place of what the variables say. Throws INVALID_ARGUMENT as
  // Credentials' constructor does.
  std::shared_ptr<Credentials> credentials() const;

  // The variables the flags given stand for, for the processes a command starts (a launch's
  // replicas). A --token-file also sets TROUPE_TOKEN empty, so that it wins over an inherited
  // token, as it does here.
  std::map<std::string, std::string> environment() const;

  std::string caFile, certFile, keyFile, tokenFile;
  bool requireClientCertificates = false;
};

// `flag` when given, else the environment variable `variable` ("" when it is unset or empty):
// how a flag stands for its variable.
std::string flagOrEnvironment(const std::string& flag, const char* variable);

// The resolver URL: `flag` (--resolver) when given, else $TROUPE_RESOLVER, else UsageError.
std::string resolverUrl(const std::string& flag);

// What a command that talks to troupe sets up first: a loop on this thread whose components use
// the command's credentials and, opened on the first call of resolver(), the resolver its
// --resolver flag (or $TROUPE_RESOLVER) names. Lives for the command's run().
class CommandLoop {
public:
  explicit CommandLoop(const CredentialFlags& credentials, EventLoopOptions options = {});
  KJ_DISALLOW_COPY(CommandLoop);

  // The resolver `flag` names (see resolverUrl()), opened once; throws UsageError without one.
  Resolver& resolver(const std::string& flag);

  EventLoop loop;

private:
  kj::Own<Resolver> opened;
};

// Whether standard output is a terminal (progress lines, colours, tables are for people).
bool stdoutIsTerminal();

// Prints `rows` (the first one a header, when `header`): on a terminal in aligned columns, the
// header included; elsewhere one line per row, fields separated by one space, without the header
// (the last field may hold spaces). Prints `empty` on a terminal when there are no other rows.
void printRows(const std::vector<std::vector<std::string>>& rows, bool header, kj::StringPtr empty);

// How long before `now` the time `registeredAtMillis` (Unix time, ms) was: "3s", "5m12s",
// "2h03m", "4d"; "-" for 0 (the resolver did not say).
std::string formatAge(uint64_t registeredAtMillis, kj::Date now);

// "tcp://...", "tls://..." and "unix:..." are addresses; anything else is an endpoint name or
// prefix.
bool isAddress(const std::string& text);

// The endpoints `target` names in `resolver`: the one named exactly `target` if there is one,
// else every endpoint whose name starts with it (a job's members, "ps/" or "ps/shard"). Fails
// with NO_ENDPOINTS when there are none.
kj::Promise<kj::Array<Endpoint>> endpointsNamed(Resolver& resolver, kj::StringPtr target);

}  // namespace troupe::cli
