#include "tools/troupe/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "troupe/actor/errors.h"

namespace troupe::cli {

namespace {

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

}  // namespace

Args::Args(int argc, char** argv, const std::vector<std::string>& switches,
           const std::vector<std::string>& valued) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (sawDoubleDash || arg == "-" || arg.empty() || arg[0] != '-') {
      positional.push_back(arg);
      if (!sawDoubleDash) positionalBeforeDoubleDash = positional.size();
      continue;
    }
    if (arg == "--") {
      sawDoubleDash = true;
      continue;
    }
    std::string name = arg;
    std::string value;
    bool inlineValue = false;
    auto eq = arg.find('=');
    if (eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inlineValue = true;
    }
    if (name == "-h") name = "--help";
    if (contains(switches, name) || name == "--help") {
      if (inlineValue) throw UsageError{name + " takes no value"};
      flags[name] = "";
    } else if (contains(valued, name)) {
      if (!inlineValue) {
        if (i + 1 >= argc) throw UsageError{name + " needs a value"};
        value = argv[++i];
      }
      flags[name] = value;
    } else {
      throw UsageError{"unknown option " + name};
    }
  }
}

std::string Args::value(const std::string& flag, const std::string& otherwise) const {
  auto it = flags.find(flag);
  return it == flags.end() ? otherwise : it->second;
}

uint64_t Args::number(const std::string& flag, uint64_t otherwise, uint64_t min) const {
  auto it = flags.find(flag);
  if (it == flags.end()) return otherwise;
  const char* text = it->second.c_str();
  char* end = nullptr;
  errno = 0;
  unsigned long long n = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || n < min) {
    throw UsageError{flag + " needs a whole number" +
                     (min > 0 ? " of at least " + std::to_string(min) : std::string()) +
                     ", not '" + it->second + "'"};
  }
  return n;
}

double Args::decimal(const std::string& flag, double otherwise) const {
  auto it = flags.find(flag);
  if (it == flags.end()) return otherwise;
  const char* text = it->second.c_str();
  char* end = nullptr;
  errno = 0;
  double d = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(d) || d <= 0) {
    throw UsageError{flag + " needs a positive number, not '" + it->second + "'"};
  }
  return d;
}

std::string resolverUrl(const Args& args) {
  auto url = args.value("--resolver");
  if (!url.empty()) return url;
  const char* env = getenv("TROUPE_RESOLVER");
  if (env != nullptr && env[0] != '\0') return env;
  throw UsageError{"no resolver: pass --resolver URL or set TROUPE_RESOLVER "
                   "(e.g. registry://127.0.0.1:7700)"};
}

bool stdoutIsTerminal() { return isatty(STDOUT_FILENO) == 1; }

std::string formatAge(uint64_t registeredAtMillis) {
  if (registeredAtMillis == 0) return "-";
  auto now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count());
  uint64_t s = now > registeredAtMillis ? (now - registeredAtMillis) / 1000 : 0;
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

bool isAddress(const std::string& text) {
  return text.rfind("tcp://", 0) == 0 || text.rfind("unix:", 0) == 0;
}

int runCommand(const char* name, const char* usage, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    fprintf(stderr, "troupe %s: %s\n%s", name, e.message.c_str(), usage);
    return 2;
  } catch (const kj::Exception& e) {
    fprintf(stderr, "troupe %s: %s\n", name, errorMessage(e).cStr());
    return 1;
  } catch (const std::exception& e) {
    fprintf(stderr, "troupe %s: %s\n", name, e.what());
    return 1;
  }
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
