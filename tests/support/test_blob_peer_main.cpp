// A process for the blob tests (tests/actor/blob_process_test.cpp), either end of a transfer.
//
//   troupe_test_blob_peer receive [--pause-at BYTES] [--idle-ms MS] [--listen ADDRESS]
//                                 [--deny-reads]
//     An ActorServer on 127.0.0.1 (or ADDRESS) accepting blobs named "weights". Prints "LISTENING
//     <address>", then for each blob handed over "RECEIVED <version> <size> <xxh3-64 hex>", for
//     each given up "GAVE_UP <why>"; after either, "SHARED <messages received through shared
//     memory so far>" and "READ <bytes read from senders' memory so far>"; and "FREED <bytes>"
//     when a blob's memory is freed. With
//     --pause-at, the first time a transfer has that many bytes it prints "PAUSED <bytes>" and its
//     loop stops (as a frozen process's would) until SIGUSR1 arrives, then prints "RESUMED".
//     With --deny-reads, a seccomp filter makes process_vm_readv() fail with EPERM, as container
//     runtimes' default filters do where the process may not trace others.
//
//   troupe_test_blob_peer send --to ENDPOINT=ADDRESS [--size BYTES] [--chunk BYTES]
//                              [--window BYTES] [--reads yes|no]
//     Sends one blob of pseudo-random bytes, printing "SENDING" first and then one line per
//     member: "RESULT <endpoint> ok" or "RESULT <endpoint> <error>". --reads: whether members on
//     this host may read the blob out of the sender's memory (BlobSendOptions::sameHostReads;
//     default yes).

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <random>
#include <string>

#include <kj/debug.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "troupe/actor/actor_server.h"
#include "troupe/actor/blob.h"

namespace {

// Arrays whose freeing is reported.
class ReportingDisposer final : public kj::ArrayDisposer {
  void disposeImpl(void* first, size_t, size_t count, size_t, void (*)(void*)) const override {
    delete[] static_cast<kj::byte*>(first);
    printf("FREED %zu\n", count);
    fflush(stdout);
  }
};
const ReportingDisposer reporting;

std::string flag(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

// Makes every process_vm_readv() of this process fail with EPERM from now on.
void denyProcessReads() {
#if defined(__x86_64__)
  constexpr uint32_t ARCH = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t ARCH = AUDIT_ARCH_AARCH64;
#else
  KJ_FAIL_REQUIRE("--deny-reads knows no seccomp architecture for this CPU");
#endif
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),  // another architecture: left alone
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog program = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])),
                               filter};
  KJ_SYSCALL(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
  KJ_SYSCALL(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program));
}

bool hasFlag(int argc, char** argv, const char* name) {
  for (int i = 2; i < argc; ++i) {
    if (strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

int receive(int argc, char** argv) {
  if (hasFlag(argc, argv, "--deny-reads")) denyProcessReads();
  uint64_t pauseAt = std::stoull(flag(argc, argv, "--pause-at", "0"));
  auto idle = std::stoull(flag(argc, argv, "--idle-ms", "30000")) * kj::MILLISECONDS;
  // SIGUSR1 stays blocked, to be taken by sigwait() while paused.
  sigset_t resume;
  sigemptyset(&resume);
  sigaddset(&resume, SIGUSR1);
  sigprocmask(SIG_BLOCK, &resume, nullptr);

  troupe::EventLoop loop;
  troupe::JobContext job;
  job.jobId = "blobs";
  troupe::ActorServer server(loop, job);
  bool paused = false;
  troupe::BlobAcceptOptions options;
  options.idleTimeout = idle;
  options.onProgress = [&](const troupe::BlobHeader&, uint64_t received) {
    if (pauseAt == 0 || paused || received < pauseAt) return;
    paused = true;
    printf("PAUSED %llu\n", static_cast<unsigned long long>(received));
    fflush(stdout);
    int signal = 0;
    sigwait(&resume, &signal);
    printf("RESUMED\n");
    fflush(stdout);
  };
  auto paths = [&server]() {
    auto metrics = server.metrics();
    printf("SHARED %.0f\n", metrics.sum("troupe_shared_messages_received_total"));
    printf("READ %.0f\n", metrics.sum("troupe_blob_sender_memory_read_bytes_total"));
    fflush(stdout);
  };
  options.onGiveUp = [&paths](const troupe::BlobHeader&, const kj::Exception& why) {
    printf("GAVE_UP %s\n", why.getDescription().cStr());
    paths();
  };
  server.acceptBlobs(
      "weights",
      [](const troupe::BlobHeader& h) {
        return kj::Array<kj::byte>(new kj::byte[h.size], h.size, reporting);
      },
      [&paths](troupe::Blob b) {
        printf("RECEIVED %llu %zu %016llx\n", static_cast<unsigned long long>(b.version),
               b.bytes.size(),
               static_cast<unsigned long long>(XXH3_64bits(b.bytes.begin(), b.bytes.size())));
        paths();
      },
      kj::mv(options));
  auto address = server.listen(flag(argc, argv, "--listen", "tcp://127.0.0.1:0").c_str());
  printf("LISTENING %s\n", address.c_str());
  fflush(stdout);
  server.serveUntilSignal();
  return 0;
}

int send(int argc, char** argv) {
  auto to = flag(argc, argv, "--to", "");
  auto eq = to.find('=');
  KJ_REQUIRE(eq != std::string::npos, "--to ENDPOINT=ADDRESS");
  uint64_t size = std::stoull(flag(argc, argv, "--size", "16777216"));
  troupe::BlobSendOptions options;
  options.chunkBytes = std::stoul(flag(argc, argv, "--chunk", "262144"));
  options.windowBytes = std::stoull(flag(argc, argv, "--window", "1048576"));
  options.sameHostReads = flag(argc, argv, "--reads", "yes") != "no";
  auto bytes = kj::heapArray<kj::byte>(size);
  std::mt19937_64 random(size);
  for (auto& b : bytes) b = static_cast<kj::byte>(random());
  troupe::EventLoop loop;
  troupe::BlobTarget target{to.substr(0, eq), to.substr(eq + 1)};
  auto transfer = troupe::sendBlob(loop, kj::arrayPtr(&target, 1), "weights", 1, kj::mv(bytes),
                                   options);
  printf("SENDING\n");
  fflush(stdout);
  for (auto& r : transfer.waitAll(600 * kj::SECONDS).wait(loop.waitScope())) {
    KJ_IF_MAYBE(e, r.error) {
      printf("RESULT %s %s\n", r.endpoint.c_str(), e->getDescription().cStr());
    } else {
      printf("RESULT %s ok\n", r.endpoint.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "receive") == 0) return receive(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "send") == 0) return send(argc, argv);
  fprintf(stderr, "usage: troupe_test_blob_peer receive|send ...\n");
  return 2;
}
