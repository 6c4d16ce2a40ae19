// A replica program for the launcher tests (tests/jobs). What it does depends on its first
// argument:
//
//   env [NAME...]          prints "NAME=value" (or "NAME unset") for troupe's and the device's
//                          variables and each NAME given, then exits 0
//   exit N                 exits with status N
//   lines N                prints "line 1" ... "line N" on stdout, then "err done" on stderr,
//                          and exits 0
//   wait [--ignore-term] [--grandchild]
//                          (with --ignore-term: ignores SIGTERM; with --grandchild: forks a
//                          process that stays in its process group and waits too), tells the
//                          test it started, then waits for a signal forever
//   task-exit I N          as `exit N` in the replica whose task index is I (TROUPE_TASK_INDEX,
//                          else SLURM_PROCID); as `wait` in the others
//
// "Tells the test": when TROUPE_TEST_NOTIFY names a FIFO, writes one line
// "STARTED <task index> <pid> <grandchild pid or 0>" to it.

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>

namespace {

const char* env(const char* name) { return getenv(name); }

// The replica's index as JobContext reads it: TROUPE_TASK_INDEX, else Slurm's SLURM_PROCID.
const char* taskIndex() {
  const char* task = env("TROUPE_TASK_INDEX");
  return task != nullptr ? task : env("SLURM_PROCID");
}

void printVariable(const char* name) {
  const char* value = env(name);
  if (value == nullptr) {
    printf("%s unset\n", name);
  } else {
    printf("%s=%s\n", name, value);
  }
}

void notifyStarted(pid_t grandchild) {
  const char* path = env("TROUPE_TEST_NOTIFY");
  if (path == nullptr) return;
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  const char* task = taskIndex();
  char line[128];
  int n = snprintf(line, sizeof(line), "STARTED %s %d %d\n", task != nullptr ? task : "?",
                   static_cast<int>(getpid()), static_cast<int>(grandchild));
  if (write(fd, line, static_cast<size_t>(n)) != n) {
    // The test reads what arrives; nothing to do.
  }
  close(fd);
}

[[noreturn]] void waitForever(bool ignoreTerm, bool grandchild) {
  if (ignoreTerm) signal(SIGTERM, SIG_IGN);
  pid_t child = 0;
  if (grandchild) {
    child = fork();
    if (child == 0) {
      for (;;) pause();
    }
  }
  notifyStarted(child);
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s env|exit|lines|wait|task-exit ...\n", argv[0]);
    return 2;
  }
  std::string command = argv[1];
  if (command == "env") {
    for (const char* name :
         {"TROUPE_JOB_ID", "TROUPE_TASK_INDEX", "TROUPE_NUM_TASKS", "TROUPE_RESOLVER",
          "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "LIBTPU_INIT_ARGS", "TROUPE_ENTRYPOINT"}) {
      printVariable(name);
    }
    for (int i = 2; i < argc; ++i) printVariable(argv[i]);
    return 0;
  }
  if (command == "exit" && argc == 3) return atoi(argv[2]);
  if (command == "lines" && argc == 3) {
    int n = atoi(argv[2]);
    for (int i = 1; i <= n; ++i) {
      printf("line %d\n", i);
      fflush(stdout);
    }
    fprintf(stderr, "err done\n");
    return 0;
  }
  if (command == "wait") {
    bool ignoreTerm = false;
    bool grandchild = false;
    for (int i = 2; i < argc; ++i) {
      if (strcmp(argv[i], "--ignore-term") == 0) ignoreTerm = true;
      if (strcmp(argv[i], "--grandchild") == 0) grandchild = true;
    }
    waitForever(ignoreTerm, grandchild);
  }
  if (command == "task-exit" && argc == 4) {
    const char* task = taskIndex();
    if (task != nullptr && strcmp(task, argv[2]) == 0) return atoi(argv[3]);
    waitForever(false, false);
  }
  fprintf(stderr, "unknown command %s\n", argv[1]);
  return 2;
}
