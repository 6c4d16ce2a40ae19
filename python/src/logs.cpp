#include "python/src/logs.h"

#include <stdio.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <kj/common.h>
#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "troupe/base/logging.h"
#include "python/src/runtime.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

// Python's level numbers for spdlog's trace, debug, info, warn, err and critical, in order.
constexpr int PYTHON_LEVELS[] = {5, 10, 20, 30, 40, 50};

int pythonLevel(spdlog::level::level_enum level) {
  auto i = static_cast<size_t>(level);
  return i < kj::size(PYTHON_LEVELS) ? PYTHON_LEVELS[i] : 20;
}

struct Record {
  int level;
  double created;  // seconds since the epoch
  std::string message;
};

// Records not yet handed to Python, and where they go. The handler is dropped (under the GIL)
// by close_logs(); records made after it go to stderr as troupe's own programs write them.
struct Queue {
  std::mutex mutex;
  std::vector<Record> records;
  bool open = true;
  std::optional<py::object> handler;  // read and reset with the GIL held
};

Queue& queue() {
  static auto* q = new Queue();  // never destroyed: threads may log during the process's exit
  return *q;
}

// Hands `batch` to the handler. GIL held.
void deliver(std::vector<Record> batch) {
  if (batch.empty()) return;
  if (!queue().handler) {  // none registered yet: as troupe's own programs write them
    for (auto& r : batch) fprintf(stderr, "[troupe] %s\n", r.message.c_str());
    return;
  }
  py::list out;
  for (auto& r : batch) out.append(py::make_tuple(r.level, r.created, r.message));
  try {
    (*queue().handler)(out);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("troupe's log handler");
  }
}

// Hands what is queued to the handler. GIL held.
void deliver() {
  std::vector<Record> batch;
  {
    std::lock_guard<std::mutex> lock(queue().mutex);
    batch.swap(queue().records);
  }
  deliver(kj::mv(batch));
}

// Queues each record for Python; straight to stderr once Python has closed the queue.
class PythonSink final : public spdlog::sinks::base_sink<std::mutex> {
public:
  PythonSink() : stderrFormat("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v") {}

protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::string text(msg.payload.data(), msg.payload.size());
    double created = std::chrono::duration<double>(msg.time.time_since_epoch()).count();
    bool first;
    {
      std::lock_guard<std::mutex> lock(queue().mutex);
      if (!queue().open) {
        spdlog::memory_buf_t line;
        stderrFormat.format(msg, line);
        fwrite(line.data(), 1, line.size(), stderr);
        return;
      }
      first = queue().records.empty();
      queue().records.push_back(Record{pythonLevel(msg.level), created, kj::mv(text)});
    }
    if (first) withGilSoon([]() { deliver(); });
  }
  void flush_() override {}

private:
  spdlog::pattern_formatter stderrFormat;
};

}  // namespace

std::shared_ptr<spdlog::logger> pythonLogger() {
  static std::shared_ptr<spdlog::logger> logger = []() {
    auto l = newLogger("troupe");  // its level from TROUPE_LOG_LEVEL
    l->sinks().clear();
    l->sinks().push_back(std::make_shared<PythonSink>());
    return l;
  }();
  return logger;
}

void bindLogs(py::module_& m) {
  m.def("set_log_handler", [](py::object handler) { queue().handler = kj::mv(handler); });
  m.def("flush_logs", []() { deliver(); });
  m.def("close_logs", []() {
    // Closed and emptied at once, so that no record is left behind in between.
    std::vector<Record> batch;
    {
      std::lock_guard<std::mutex> lock(queue().mutex);
      queue().open = false;
      batch.swap(queue().records);
    }
    deliver(kj::mv(batch));
    queue().handler.reset();
  });
}

}  // namespace troupe::python
