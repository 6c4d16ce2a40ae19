// troupe stop JOB [--grace DURATION]: has the launcher that owns a job stop it, through the
// resolver, with the job's token or the registry's administrator token.

#include <stdio.h>

#include <string>

#include <openssl/crypto.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

// The --grace default, as JobHandle::terminate's.
constexpr kj::Duration DEFAULT_GRACE = 30 * kj::SECONDS;

class StopCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(kj::MainBuilder(
                   context, VERSION_TEXT,
                   "Stops job JOB: its launcher (a troupe launch, a program's launcher, or a Slurm "
                   "launcher) sends SIGTERM to every replica, which drains, SIGKILLs those still "
                   "running after the grace, and ends the job; returns once it has ended. Only "
                   "the job's owner may (its token: the file job-token in the job's log folder, "
                   "which troupe launch prints, as --job-token-file or $TROUPE_JOB_TOKEN_FILE) or "
                   "an administrator (the registry's --admin-token-file, as --admin-token-file or "
                   "$TROUPE_ADMIN_TOKEN_FILE). A job that has already ended is left as it is, and "
                   "said so.")
                   .addOptionWithArg(
                       {"grace"},
                       [this](kj::StringPtr text) {
                         grace = parseDuration("--grace", text, 0 * kj::SECONDS, 24 * kj::HOURS);
                         return true;
                       },
                       "DURATION",
                       "How long replicas may drain before they are killed (default 30s).")
                   .addOptionWithArg({"job-token-file"}, storeIn(jobTokenFile), "FILE",
                                     "The job's token (default: $TROUPE_JOB_TOKEN_FILE).")
                   .addOptionWithArg({"admin-token-file"}, storeIn(adminTokenFile), "FILE",
                                     "The registry's administrator token, instead of the job's "
                                     "(default: $TROUPE_ADMIN_TOKEN_FILE).")
                   .addOptionWithArg({"resolver"}, storeIn(resolver), "URL",
                                     "registry://HOST:PORT, registry+unix:PATH (default: "
                                     "$TROUPE_RESOLVER). Only the registry relays to launchers.")
                   .expectArg("JOB", storeIn(jobId)))
        .build();
  }

  int run() override {
    std::string credential = this->credential();
    KJ_DEFER(OPENSSL_cleanse(credential.data(), credential.size()));
    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    auto& opened = command.resolver(resolver);
    if (stdoutIsTerminal()) {
      printf("stopping job %s (grace %s)...\n", jobId.c_str(), durationText(grace).cStr());
      fflush(stdout);
    }
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  opened.stopJob(jobId.c_str(), grace, credential).wait(loop.waitScope());
                })) {
      if (errorCode(*e) != ErrorCode::JOB_ENDED) kj::throwFatalException(kj::mv(*e));
      printf("%s\n", errorMessage(*e).cStr());
      return 0;
    }
    printf("job %s stopped\n", jobId.c_str());
    return 0;
  }

private:
  // The administrator's token when one is named, else the job's; empty when neither is.
  std::string credential() const {
    auto admin = flagOrEnvironment(adminTokenFile, "TROUPE_ADMIN_TOKEN_FILE");
    if (!admin.empty()) return readSecret("the administrator token file", admin);
    auto job = flagOrEnvironment(jobTokenFile, "TROUPE_JOB_TOKEN_FILE");
    if (!job.empty()) return readSecret("the job token file", job);
    return {};
  }

  kj::Duration grace = DEFAULT_GRACE;
  std::string jobTokenFile;
  std::string adminTokenFile;
  std::string resolver;
  CredentialFlags credentialFlags;
  std::string jobId;
};

}  // namespace

kj::Own<Command> stopCommand() { return kj::heap<StopCommand>(); }

}  // namespace troupe::cli
