#include "tools/troupe/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <kj/debug.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"
#include "troupe/resolver/open_resolver.h"
#include "troupe/version.h"

namespace troupe::cli {

const char* const VERSION_TEXT = "troupe " TROUPE_VERSION_STRING;

namespace {

// How a command's parser ends the program early (--help, --version, a usage error): thrown by
// the contexts below instead of exiting, so the stack unwinds and stdout is flushed.
struct Exit {
  int status;
};

using ParserFactory = kj::Function<kj::MainFunc(kj::ProcessContext&)>;

void writeLine(FILE* to, kj::StringPtr text) {
  fputs(text.cStr(), to);
  if (!text.endsWith("\n")) fputc('\n', to);
  fflush(to);
}

// Keeps what the parser would print for --help, to print it elsewhere.
class UsageCapture final : public kj::ProcessContext {
public:
  explicit UsageCapture(kj::StringPtr programName) : programName(programName) {}

  kj::StringPtr getProgramName() override { return programName; }
  void exit() override { throw Exit{0}; }
  void warning(kj::StringPtr) override {}
  void error(kj::StringPtr) override {}
  void exitError(kj::StringPtr message) override {
    text = kj::str(message);
    throw Exit{2};
  }
  void exitInfo(kj::StringPtr message) override {
    text = kj::str(message);
    throw Exit{0};
  }
  void increaseLoggingVerbosity() override {}

  kj::String text;

private:
  kj::StringPtr programName;
};

// The context every command's parser runs in: help and version go to stdout (status 0), usage
// errors to stderr with the usage of the command being read (status 2).
class CommandContext final : public kj::ProcessContext {
public:
  explicit CommandContext(kj::StringPtr programName)
      : programName(programName), current(kj::str(programName)) {}

  // From now on, the command being read is `name` and its usage comes from `parser`.
  void enter(kj::String name, ParserFactory parser) {
    current = kj::mv(name);
    usageParser = kj::mv(parser);
  }

  // "troupe call": the command being read or run, for messages.
  kj::StringPtr name() const { return current; }

  // Prints "<name>: <message>" and the usage on stderr.
  void reportUsageError(kj::StringPtr message) {
    fprintf(stderr, "%s: %s\n", current.cStr(), message.cStr());
    printUsage();
  }

  kj::StringPtr getProgramName() override { return programName; }
  void exit() override { throw Exit{hadErrors ? 1 : 0}; }
  void warning(kj::StringPtr message) override { writeLine(stderr, message); }
  void error(kj::StringPtr message) override {
    hadErrors = true;
    writeLine(stderr, message);
  }
  void exitError(kj::StringPtr message) override {
    // MainBuilder's usage errors read "<name>: <message>\nTry '<name> --help' for more
    // information."; the usage itself takes the place of that hint.
    kj::ArrayPtr<const char> text = message;
    for (size_t i = 0; i + 6 <= message.size(); ++i) {
      if (message.slice(i).startsWith("\nTry '")) {
        text = message.slice(0, i);
        break;
      }
    }
    fprintf(stderr, "%.*s\n", static_cast<int>(text.size()), text.begin());
    printUsage();
    throw Exit{2};
  }
  void exitInfo(kj::StringPtr message) override {
    writeLine(stdout, message);
    throw Exit{0};
  }
  void increaseLoggingVerbosity() override {
    kj::_::Debug::setLogLevel(kj::_::Debug::Severity::INFO);
  }

private:
  void printUsage() {
    KJ_IF_MAYBE(parser, usageParser) {
      UsageCapture capture(current);
      kj::StringPtr help = "--help";
      try {
        (*parser)(capture)(current, kj::arrayPtr(&help, 1));
      } catch (const Exit&) {
      }
      fputs(capture.text.cStr(), stderr);
      fflush(stderr);
    }
  }

  kj::StringPtr programName;
  kj::String current;
  kj::Maybe<ParserFactory> usageParser;
  bool hadErrors = false;
};

// argv[1...] as MainBuilder takes them, with "-h" read as "--help" (before any "--").
kj::Array<kj::StringPtr> paramsOf(int argc, char** argv) {
  auto params = kj::heapArrayBuilder<kj::StringPtr>(argc > 1 ? argc - 1 : 0);
  bool options = true;
  for (int i = 1; i < argc; ++i) {
    kj::StringPtr arg = argv[i];
    if (arg == "--") options = false;
    params.add(options && arg == "-h" ? kj::StringPtr("--help") : arg);
  }
  return params.finish();
}

// Reads the arguments with the parser `top` builds, then runs the command `chosen` names (set
// while reading). Turns what is thrown into messages and an exit status.
int parseAndRun(CommandContext& context, ParserFactory& top, kj::Maybe<Command&>& chosen, int argc,
                char** argv) {
  auto params = paramsOf(argc, argv);
  try {
    top(context)(context.getProgramName(), params);
    KJ_IF_MAYBE(command, chosen) {
      return command->run();
    }
    return 0;
  } catch (const Exit& e) {
    return e.status;
  } catch (const UsageError& e) {
    context.reportUsageError(e.message.c_str());
    return 2;
  } catch (const kj::Exception& e) {
    fprintf(stderr, "%s: %s\n", context.name().cStr(), errorMessage(e).cStr());
    return 1;
  } catch (const std::exception& e) {
    fprintf(stderr, "%s: %s\n", context.name().cStr(), e.what());
    return 1;
  }
}

}  // namespace

int runCommand(kj::StringPtr programName, Command& command, int argc, char** argv) {
  CommandContext context(programName);
  context.enter(kj::str(programName),
                [&command](kj::ProcessContext& c) { return command.parser(c); });
  ParserFactory top = [&command](kj::ProcessContext& c) { return command.parser(c); };
  kj::Maybe<Command&> chosen = command;
  return parseAndRun(context, top, chosen, argc, argv);
}

int runSubcommands(kj::StringPtr programName, kj::StringPtr brief, kj::StringPtr more,
                   kj::ArrayPtr<const Subcommand> subcommands, int argc, char** argv) {
  CommandContext context(programName);
  kj::Maybe<kj::Own<Command>> made;
  kj::Maybe<Command&> chosen;
  ParserFactory top = [&](kj::ProcessContext& c) {
    kj::MainBuilder builder(c, VERSION_TEXT, brief, more);
    for (auto& sub : subcommands) {
      builder.addSubCommand(
          sub.name,
          [&]() {
            auto command = sub.make();
            Command& ref = *command;
            made = kj::mv(command);
            chosen = ref;
            context.enter(kj::str(programName, " ", sub.name),
                          [&ref](kj::ProcessContext& c) { return ref.parser(c); });
            return ref.parser(c);
          },
          sub.brief);
    }
    return builder.build();
  };
  context.enter(kj::str(programName), [&](kj::ProcessContext& c) { return top(c); });
  return parseAndRun(context, top, chosen, argc, argv);
}

kj::Function<kj::MainBuilder::Validity(kj::StringPtr)> storeIn(std::string& out) {
  return [&out](kj::StringPtr text) -> kj::MainBuilder::Validity {
    out = text;
    return true;
  };
}

uint64_t parseWhole(kj::StringPtr flag, kj::StringPtr text, uint64_t min) {
  auto parsed = parseWholeNumber(text);
  uint64_t value = parsed.orDefault(0);
  if (parsed == nullptr || value < min) {
    throw UsageError{kj::str(flag, " needs a whole number",
                             min > 0 ? kj::str(" of at least ", min) : kj::str(), ", not '",
                             printable(text), "'")
                         .cStr()};
  }
  return value;
}

double parseCores(kj::StringPtr flag, kj::StringPtr text) {
  double value = 0;
  auto failed = kj::runCatchingExceptions([&]() { value = text.parseAs<double>(); });
  if (failed != nullptr || !std::isfinite(value) || value < 0) {
    throw UsageError{
        kj::str(flag, " needs a number, 0 or more, not '", printable(text), "'").cStr()};
  }
  return value;
}

kj::Duration parseDuration(kj::StringPtr flag, kj::StringPtr text, kj::Duration min,
                           kj::Duration max) {
  struct Unit {
    const char* suffix;
    kj::Duration size;
  };
  // "ms" before "m" and "s", which it ends with too.
  static constexpr Unit UNITS[] = {{"ms", 1 * kj::MILLISECONDS},
                                   {"s", 1 * kj::SECONDS},
                                   {"m", 1 * kj::MINUTES},
                                   {"h", 1 * kj::HOURS}};
  auto refuse = [&]() -> kj::Duration {
    throw UsageError{kj::str(flag, " needs a duration from ", durationText(min), " to ",
                             durationText(max), " such as 500ms, 30s, 2m or 1h, not '",
                             printable(text), "'")
                         .cStr()};
  };
  for (auto& unit : UNITS) {
    if (!text.endsWith(unit.suffix)) continue;
    auto number = kj::heapString(text.slice(0, text.size() - strlen(unit.suffix)));
    double value = 0;
    auto failed = kj::runCatchingExceptions([&]() { value = number.parseAs<double>(); });
    // Bounded in doubles first, so that no product below overflows a kj::Duration.
    double millis = value * static_cast<double>(unit.size / kj::MILLISECONDS);
    if (failed != nullptr || !std::isfinite(value) || millis < 0 ||
        millis > static_cast<double>(max / kj::MILLISECONDS)) {
      return refuse();
    }
    // Whole milliseconds, cut down: "0.5ms" is below any minimum rather than rounded up to one.
    auto duration = static_cast<int64_t>(millis) * kj::MILLISECONDS;
    return duration < min ? refuse() : duration;
  }
  return refuse();
}

kj::String durationText(kj::Duration duration) {
  int64_t millis = duration / kj::MILLISECONDS;
  if (millis == 0 || millis % 1000 != 0) return kj::str(millis, "ms");
  int64_t seconds = millis / 1000;
  if (seconds % 60 != 0) return kj::str(seconds, "s");
  if (seconds % 3600 != 0) return kj::str(seconds / 60, "m");
  return kj::str(seconds / 3600, "h");
}

std::string flagOrEnvironment(const std::string& flag, const char* variable) {
  if (!flag.empty()) return flag;
  const char* env = getenv(variable);
  return env != nullptr ? env : "";
}

std::string resolverUrl(const std::string& flag) {
  auto url = flagOrEnvironment(flag, "TROUPE_RESOLVER");
  if (!url.empty()) return url;
  throw UsageError{"no resolver: pass --resolver URL or set TROUPE_RESOLVER "
                   "(e.g. registry://127.0.0.1:7700)"};
}

CommandLoop::CommandLoop(const CredentialFlags& credentials, EventLoopOptions options)
    : loop(kj::mv(options)) {
  setLoopCredentials(loop, credentials.credentials());
}

Resolver& CommandLoop::resolver(const std::string& flag) {
  if (opened.get() == nullptr) opened = openResolver(loop, resolverUrl(flag).c_str());
  return *opened;
}

bool stdoutIsTerminal() { return isatty(STDOUT_FILENO) == 1; }

void printRows(const std::vector<std::vector<std::string>>& rows, bool header,
               kj::StringPtr empty) {
  if (!stdoutIsTerminal()) {
    for (size_t r = header ? 1 : 0; r < rows.size(); ++r) {
      for (size_t i = 0; i < rows[r].size(); ++i) {
        printf(i + 1 < rows[r].size() ? "%s " : "%s\n", rows[r][i].c_str());
      }
    }
    return;
  }
  std::vector<size_t> widths;
  for (auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      // The last column is not padded: no trailing spaces.
      if (i + 1 < row.size()) {
        printf("%-*s  ", static_cast<int>(widths[i]), row[i].c_str());
      } else {
        printf("%s\n", row[i].c_str());
      }
    }
  }
  if (rows.size() == (header ? 1u : 0u)) printf("%s\n", empty.cStr());
}

std::string formatAge(uint64_t registeredAtMillis, kj::Date now) {
  if (registeredAtMillis == 0) return "-";
  auto nowMillis = static_cast<uint64_t>((now - kj::UNIX_EPOCH) / kj::MILLISECONDS);
  uint64_t s = nowMillis > registeredAtMillis ? (nowMillis - registeredAtMillis) / 1000 : 0;
  char text[32];
  if (s < 60) {
    snprintf(text, sizeof(text), "%llus", static_cast<unsigned long long>(s));
  } else if (s < 3600) {
    snprintf(text, sizeof(text), "%llum%02llus", static_cast<unsigned long long>(s / 60),
             static_cast<unsigned long long>(s % 60));
  } else if (s < 86400) {
    snprintf(text, sizeof(text), "%lluh%02llum", static_cast<unsigned long long>(s / 3600),
             static_cast<unsigned long long>(s % 3600 / 60));
  } else {
    snprintf(text, sizeof(text), "%llud", static_cast<unsigned long long>(s / 86400));
  }
  return text;
}

kj::MainBuilder& CredentialFlags::addTo(kj::MainBuilder& builder, bool server) {
  builder
      .addOptionWithArg({"tls-ca"}, storeIn(caFile), "FILE",
                        "CA certificates (PEM) that TLS peers must chain to ($TROUPE_TLS_CA).")
      .addOptionWithArg({"tls-cert"}, storeIn(certFile), "FILE",
                        "This process's TLS certificate (PEM) ($TROUPE_TLS_CERT).")
      .addOptionWithArg({"tls-key"}, storeIn(keyFile), "FILE",
                        "Its private key (PEM) ($TROUPE_TLS_KEY).")
      .addOptionWithArg({"token-file"}, storeIn(tokenFile), "FILE",
                        "A file holding the cluster token ($TROUPE_TOKEN_FILE).");
  if (server) {
    builder.addOption(
        {"tls-require-client-cert"},
        [this]() {
          requireClientCertificates = true;
          return true;
        },
        "Mutual TLS: accept only clients with a certificate from the CA "
        "($TROUPE_TLS_REQUIRE_CLIENT_CERT=1).");
  }
  return builder;
}

std::shared_ptr<Credentials> CredentialFlags::credentials() const {
  auto options = Credentials::optionsFromEnvironment();
  if (!caFile.empty() || !certFile.empty() || !keyFile.empty() || requireClientCertificates) {
    TlsOptions tls;
    KJ_IF_MAYBE(given, options.tls) {
      tls = *given;
    }
    if (!caFile.empty()) tls.caFile = caFile;
    if (!certFile.empty()) tls.certFile = certFile;
    if (!keyFile.empty()) tls.keyFile = keyFile;
    if (requireClientCertificates) tls.requireClientCertificates = true;
    options.tls = kj::mv(tls);
  }
  if (!tokenFile.empty()) {
    options.token.clear();  // the flag wins over a token from the environment
    options.tokenFile = tokenFile;
  }
  return std::make_shared<Credentials>(kj::mv(options));
}

std::map<std::string, std::string> CredentialFlags::environment() const {
  std::map<std::string, std::string> out;
  auto set = [&out](const char* name, const std::string& value) {
    if (!value.empty()) out[name] = value;
  };
  set("TROUPE_TLS_CA", caFile);
  set("TROUPE_TLS_CERT", certFile);
  set("TROUPE_TLS_KEY", keyFile);
  if (!tokenFile.empty()) {
    out["TROUPE_TOKEN"] = "";  // an empty token is none: the file wins over an inherited one
    out["TROUPE_TOKEN_FILE"] = tokenFile;
  }
  if (requireClientCertificates) out["TROUPE_TLS_REQUIRE_CLIENT_CERT"] = "1";
  return out;
}

bool isAddress(const std::string& text) {
  return text.rfind("tcp://", 0) == 0 || text.rfind("tls://", 0) == 0 ||
         text.rfind("unix:", 0) == 0;
}

kj::Promise<kj::Array<Endpoint>> endpointsNamed(Resolver& resolver, kj::StringPtr target) {
  std::string name = target.cStr();
  return resolver.resolve(target).then([name](kj::Array<Endpoint> found) {
    for (auto& e : found) {
      if (e.name == name) return kj::heapArray<Endpoint>({e});
    }
    if (found.size() == 0) {
      throwError(ErrorCode::NO_ENDPOINTS,
                 kj::str("no endpoint is named '", name.c_str(), "' or starts with it"));
    }
    return kj::mv(found);
  });
}

}  // namespace troupe::cli
