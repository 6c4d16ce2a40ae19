// An inference service behind a pool, with a replica killed under load.
//
//   inference_demo --resolver URL [--replicas N] [--requests R] [--concurrency C]
//
// The driver (this program as a person runs it) submits a job "infer" of N replicas to a
// LocalLauncher publishing in the resolver at URL (e.g. registry://127.0.0.1:7700). The launcher
// runs each replica as this same program again, on its "server" entrypoint: a process hosting
// the actor "model", which answers `infer` with a fixed two-layer perceptron (model.h). The driver
// sends R requests through an ActorPool (least outstanding first), C at a time, each marked
// idempotent, and after R/2 responses kills one replica with SIGKILL. The calls in flight on
// it fail with DISCONNECTED and the pool sends them to another replica, so every request still
// succeeds; the driver checks each output against the model computed here, prints throughput,
// latency and who served what, and exits non-zero if a request failed or an output differed.
// The job allows one failure (maxRetriesFailure = 1), so the launcher starts the killed replica
// again; the driver reports whether it came back.

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <troupe/actor/job_context.h>
#include <troupe/base/errors.h>
#include <troupe/base/parse_number.h>
#include <troupe/jobs/launcher.h>
#include <troupe/jobs/local_launcher.h>
#include <troupe/pool/actor_pool.h>
#include <troupe/resolver/host_actor.h>

#include "inference.capnp.h"
#include "model.h"

using inference::InferenceServer;
using Clock = std::chrono::steady_clock;

namespace {

constexpr kj::StringPtr JOB = "infer"_kj;
constexpr kj::StringPtr ACTOR = "model"_kj;
constexpr kj::Duration REQUEST_DEADLINE = 10 * kj::SECONDS;
constexpr kj::Duration READY_TIMEOUT = 30 * kj::SECONDS;
constexpr kj::Duration RESTART_TIMEOUT = 10 * kj::SECONDS;

// The replica's actor. The model is small (about 10k multiply-adds a call), so it runs on the
// event loop: a trip to a worker thread (EventLoop::offload) would cost more than the work.
class InferenceServerImpl final : public InferenceServer::Server {
public:
  explicit InferenceServerImpl(std::string replica) : replica(kj::mv(replica)) {}

protected:
  kj::Promise<void> infer(InferContext context) override {
    auto in = context.getParams().getInput();
    std::vector<float> input;
    input.reserve(in.size());
    for (float v : in) input.push_back(v);
    auto out = model.forward(input.data(), input.size());
    auto results = context.getResults();
    auto output = results.initOutput(out.size());
    for (size_t i = 0; i < out.size(); ++i) output.set(i, out[i]);
    results.setReplica(replica);
    ++served;
    return kj::READY_NOW;
  }

  kj::Promise<void> stats(StatsContext context) override {
    context.getResults().setServed(served);
    return kj::READY_NOW;
  }

private:
  const inference::Model model;
  const std::string replica;
  uint64_t served = 0;
};

int runServer(troupe::EventLoop& loop) {
  auto job = troupe::JobContext::fromEnvironment();
  auto replica = job.endpointName(ACTOR) + " pid " + std::to_string(getpid());
  return troupe::hostActor<InferenceServer>(loop, ACTOR, kj::heap<InferenceServerImpl>(replica));
}

// ---------------------------------------------------------------------------------------------
// The driver.

struct DriverOptions {
  const char* program = "inference_demo";  // argv[0], for messages
  std::string resolver;
  uint32_t replicas = 3;
  uint64_t requests = 2000;
  uint32_t concurrency = 16;
};

[[noreturn]] void usage(const char* program, const char* problem) {
  fprintf(stderr, "%s: %s\n", program, problem);
  fprintf(stderr,
          "usage: %s --resolver URL [--replicas N] [--requests R] [--concurrency C]\n"
          "  N replicas (default 3, at least 2), R requests (default 2000, at least 2),\n"
          "  C requests in flight (default 16)\n",
          program);
  exit(2);
}

uint64_t parseCount(const char* program, const char* flag, const char* text, uint64_t min,
                    uint64_t max) {
  auto parsed = troupe::parseWholeNumber(kj::StringPtr(text), max);
  uint64_t value = parsed.orDefault(0);
  if (parsed == nullptr || value < min) {
    auto problem = kj::str(flag, " takes a whole number from ", min, " to ", max, ", not '",
                           troupe::printable(kj::StringPtr(text)), "'");
    usage(program, problem.cStr());
  }
  return value;
}

DriverOptions parseArgs(int argc, char** argv) {
  DriverOptions options;
  options.program = argv[0];
  for (int i = 1; i < argc; i += 2) {
    kj::StringPtr flag = argv[i];
    if (flag != "--resolver" && flag != "--replicas" && flag != "--requests" &&
        flag != "--concurrency") {
      usage(argv[0], kj::str("unknown argument '", troupe::printable(flag), "'").cStr());
    }
    if (i + 1 >= argc) usage(argv[0], kj::str(flag, " needs a value").cStr());
    const char* value = argv[i + 1];
    if (flag == "--resolver") {
      options.resolver = value;
    } else if (flag == "--replicas") {
      options.replicas = parseCount(argv[0], argv[i], value, 2, 64);
    } else if (flag == "--requests") {
      options.requests = parseCount(argv[0], argv[i], value, 2, 100000000);
    } else if (flag == "--concurrency") {
      options.concurrency = parseCount(argv[0], argv[i], value, 1, 10000);
    }
  }
  if (options.resolver.empty()) usage(argv[0], "--resolver is required");
  return options;
}

// The replica killed midway.
struct Victim {
  troupe::Endpoint endpoint;  // as the group saw it when it was killed
  int pid = 0;
};

// R requests through the pool, C at a time: C workers, each sending its next request when the
// one before it is answered. Loop thread only.
class LoadRun {
public:
  LoadRun(const DriverOptions& options, troupe::ActorPool<InferenceServer>& pool,
          troupe::JobHandle job)
      : options(options), pool(pool), job(kj::mv(job)) {}

  kj::Promise<void> run() {
    started = Clock::now();
    auto workers = kj::heapArrayBuilder<kj::Promise<void>>(options.concurrency);
    for (uint32_t i = 0; i < options.concurrency; ++i) workers.add(worker());
    return kj::joinPromises(workers.finish()).then([this]() { finished = Clock::now(); });
  }

  // Prints the figures; returns whether every request succeeded with the expected output.
  bool report() const;

  const kj::Maybe<Victim>& victim() const { return victim_; }

private:
  kj::Promise<void> worker() {
    if (next >= options.requests) return kj::READY_NOW;
    uint64_t index = next++;
    auto input = inference::sampleInput(index);
    auto sent = Clock::now();
    auto call = pool.call(
        [this, input](InferenceServer::Client server) {
          // Once per attempt: the pool calls this again for each retry.
          ++attempts;
          auto request = server.inferRequest();
          auto list = request.initInput(input.size());
          for (size_t i = 0; i < input.size(); ++i) list.set(i, input[i]);
          return request.send();
        },
        {.deadline = REQUEST_DEADLINE, .idempotent = true});
    return call
        .then(
            [this, input = kj::mv(input),
             sent](capnp::Response<InferenceServer::InferResults>&& response) {
              answered(input, sent, response);
            },
            [this, index](kj::Exception&& e) { failedCall(index, e); })
        .then([this]() {
          if (++responses == options.requests / 2) killOne();
          return worker();
        });
  }

  void answered(const std::vector<float>& input, Clock::time_point sent,
                InferenceServer::InferResults::Reader response) {
    latenciesUs.push_back(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent).count());
    ++servedBy[response.getReplica()];
    auto expected = model.forward(input.data(), input.size());
    auto output = response.getOutput();
    bool same = output.size() == expected.size();
    for (size_t i = 0; same && i < expected.size(); ++i) same = output[i] == expected[i];
    if (same) {
      ++ok;
    } else {
      ++mismatched;
    }
  }

  void failedCall(uint64_t index, const kj::Exception& e) {
    ++failed;
    if (failed <= 5) {
      fprintf(stderr, "request %llu failed (%s): %s\n", (unsigned long long)index,
              troupe::errorCodeName(troupe::errorCode(e)).cStr(), e.getDescription().cStr());
    }
  }

  // SIGKILL to the READY replica with the most calls in flight from the pool, so that some of
  // them are cut off and have to fail over.
  void killOne() {
    kj::Maybe<kj::Own<const troupe::GroupMember>> busiest;
    uint32_t most = 0;
    for (auto& member : pool.group().readyMembers()) {
      uint32_t n = pool.outstanding(member->endpoint.name);
      if (busiest == nullptr || n > most) {
        busiest = kj::mv(member);
        most = n;
      }
    }
    KJ_IF_MAYBE(member, busiest) {
      auto replicas = job.replicas();
      auto& endpoint = (*member)->endpoint;
      KJ_ASSERT(endpoint.taskIndex < replicas.size());
      int pid = replicas[endpoint.taskIndex].pid;
      KJ_ASSERT(pid > 0, "replica not running", endpoint.name);
      KJ_SYSCALL(kill(pid, SIGKILL), pid);
      printf("killed %s (pid %d) with SIGKILL after %llu responses, %u requests in flight on it\n",
             endpoint.name.c_str(), pid, (unsigned long long)responses, most);
      fflush(stdout);
      victim_ = Victim{endpoint, pid};
    } else {
      KJ_FAIL_ASSERT("no ready replica to kill");
    }
  }

  const DriverOptions& options;
  troupe::ActorPool<InferenceServer>& pool;
  troupe::JobHandle job;
  const inference::Model model;

  uint64_t next = 0;
  uint64_t responses = 0;  // answers and failures
  uint64_t ok = 0, failed = 0, mismatched = 0;
  uint64_t attempts = 0;  // requests sent to a replica, retries included
  std::vector<int64_t> latenciesUs;
  std::map<std::string, uint64_t> servedBy;  // by the response's `replica`
  kj::Maybe<Victim> victim_;
  Clock::time_point started, finished;
};

int64_t percentile(const std::vector<int64_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(q * sorted.size()));
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

bool LoadRun::report() const {
  double seconds = std::chrono::duration<double>(finished - started).count();
  auto sorted = latenciesUs;
  std::sort(sorted.begin(), sorted.end());
  printf("requests: %llu ok, %llu failed, %llu mismatched\n", (unsigned long long)ok,
         (unsigned long long)failed, (unsigned long long)mismatched);
  printf("attempts: %llu for %llu requests (%llu sent again after a failure)\n",
         (unsigned long long)attempts, (unsigned long long)options.requests,
         (unsigned long long)(attempts - options.requests));
  printf("throughput: %.0f req/s (%llu requests in %.3f s)\n", options.requests / seconds,
         (unsigned long long)options.requests, seconds);
  printf("latency us: p50 %lld p90 %lld p99 %lld max %lld\n", (long long)percentile(sorted, 0.5),
         (long long)percentile(sorted, 0.9), (long long)percentile(sorted, 0.99),
         (long long)(sorted.empty() ? 0 : sorted.back()));
  for (auto& [replica, count] : servedBy) {
    printf("served by %s: %llu\n", replica.c_str(), (unsigned long long)count);
  }
  return failed == 0 && mismatched == 0 && ok == options.requests;
}

// Waits (up to RESTART_TIMEOUT) for the killed replica to be READY again as a new incarnation,
// and says whether it was.
void reportRestart(troupe::EventLoop& loop, troupe::ActorGroupBase& group,
                   const troupe::JobHandle& job, const Victim& victim) {
  auto deadline = loop.timer().now() + RESTART_TIMEOUT;
  for (;;) {
    for (auto& e : group.members()) {
      if (e.name == victim.endpoint.name && e.state == troupe::EndpointState::READY &&
          e.incarnation != victim.endpoint.incarnation) {
        auto replica = job.replicas()[e.taskIndex];
        printf("%s came back: pid %d, incarnation %llu (was %llu), started %u times\n",
               e.name.c_str(), replica.pid, (unsigned long long)e.incarnation,
               (unsigned long long)victim.endpoint.incarnation, replica.starts);
        return;
      }
    }
    auto& ws = loop.waitScope();
    bool changed = group.whenChanged()
                       .then([]() { return true; })
                       .exclusiveJoin(loop.timer().atTime(deadline).then([]() { return false; }))
                       .wait(ws);
    if (!changed) {
      printf("%s did not come back within %llu s (job %s)\n", victim.endpoint.name.c_str(),
             (unsigned long long)(RESTART_TIMEOUT / kj::SECONDS),
             troupe::toString(job.status()).cStr());
      return;
    }
  }
}

int runDriver(const DriverOptions& options) {
  troupe::EventLoop loop({.logger = spdlog::default_logger()});
  auto& ws = loop.waitScope();
  kj::Own<troupe::LocalLauncher> launcherOwn;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                launcherOwn = kj::heap<troupe::LocalLauncher>(
                    loop, troupe::LocalLauncherOptions{.resolver = options.resolver});
              })) {
    if (troupe::errorCode(*e) != troupe::ErrorCode::INVALID_ARGUMENT) {
      kj::throwFatalException(kj::mv(*e));
    }
    usage(options.program, kj::str(troupe::errorMessage(*e)).cStr());
  }
  auto& launcher = *launcherOwn;

  auto group = troupe::createActorGroup<InferenceServer>(
      launcher,
      {.name = std::string(JOB.cStr()),
       .entrypoint = troupe::Entrypoint::function("server"),
       .resources = troupe::ResourceConfig::withCpu(0.5, "256m"),
       .replicas = options.replicas,
       .maxRetriesFailure = 1},
      ACTOR);
  auto& job = group.job;

  bool passed = false;
  kj::Maybe<kj::Exception> error = kj::runCatchingExceptions([&]() {
    auto ready = group->waitReady(options.replicas, READY_TIMEOUT).wait(ws);
    printf("%zu of %u replicas ready:", ready.size(), options.replicas);
    for (auto& e : ready) printf(" %s", e.name.c_str());
    printf("\n");
    printf("sending %llu requests, %u in flight, least outstanding first\n",
           (unsigned long long)options.requests, options.concurrency);
    fflush(stdout);

    troupe::ActorPool<InferenceServer> pool(*group,
                                            {.balancing = troupe::Balancing::LEAST_OUTSTANDING});
    LoadRun load(options, pool, job);
    load.run().wait(ws);
    passed = load.report();
    auto& victim = KJ_ASSERT_NONNULL(load.victim());
    reportRestart(loop, *group, job, victim);

    // What each live replica says it served (a restarted one counts from its restart).
    auto stats = pool.broadcast([](InferenceServer::Client s) { return s.statsRequest().send(); })
                     .waitAll(5 * kj::SECONDS)
                     .wait(ws);
    for (auto& r : stats) {
      KJ_IF_MAYBE(value, r.value) {
        printf("stats: %s served %llu\n", r.endpoint.name.c_str(),
               (unsigned long long)value->getServed());
      } else {
        printf("stats: %s failed: %s\n", r.endpoint.name.c_str(),
               KJ_ASSERT_NONNULL(r.error).getDescription().cStr());
      }
    }
    if (passed) {
      printf("inference demo passed: %llu requests, 0 failed, failover after killing %s\n",
             (unsigned long long)options.requests, victim.endpoint.name.c_str());
    } else {
      printf("inference demo FAILED\n");
    }
    fflush(stdout);
  });
  KJ_IF_MAYBE(e, error) {
    fprintf(stderr, "inference demo failed: %s\n", e->getDescription().cStr());
    fprintf(stderr, "job %s: %s %s\n", job.id().c_str(), troupe::toString(job.status()).cStr(),
            job.reason().c_str());
    for (auto& line : job.logs(5)) fprintf(stderr, "%s\n", line.c_str());
  }

  job.terminate().wait(ws);
  launcher.drain().wait(ws);
  printf("job %s %s\n", job.id().c_str(), troupe::toString(job.status()).cStr());
  return passed && error == nullptr ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::Entrypoints entrypoints;
  entrypoints.add("server", [](troupe::EventLoop& loop, std::vector<std::string>) {
    return runServer(loop);
  });
  KJ_IF_MAYBE(status, entrypoints.runIfReplica()) {
    return *status;
  }
  return runDriver(parseArgs(argc, argv));
}
