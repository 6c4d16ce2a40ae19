#pragma once
// RAII ownership of libuv handles, for code that adds handles of its own to an EventLoop's libuv
// loop (EventLoop::uvLoop()): troupe's own event port, signals and child processes, and
// components built on troupe. A libuv handle's memory must outlive uv_close() until the loop runs
// its close callback, so handles live on the heap and the close callback frees them.

#include <uv.h>

#include <kj/common.h>
#include <kj/debug.h>

namespace troupe {

// Owns one libuv handle of type H (uv_poll_t, uv_timer_t, uv_async_t, uv_signal_t, ...).
// Belongs to the loop thread that initialised it. Dropping it closes the handle; the memory is
// freed by the loop on its next turn, so the owning uv_loop_t must run (or be torn down by
// EventLoop) after the last UvHandle is dropped.
template <typename H>
class UvHandle {
public:
  UvHandle() : handle(new H{}) {}
  ~UvHandle() noexcept { close(); }
  KJ_DISALLOW_COPY(UvHandle);
  UvHandle(UvHandle&& other) noexcept : handle(other.handle), initialised(other.initialised) {
    other.handle = nullptr;
  }

  // Call after a successful uv_xxx_init(loop, get(), ...).
  void markInitialised() { initialised = true; }

  H* get() { return handle; }
  const H* get() const { return handle; }
  H* operator->() { return handle; }

  // Closes the handle now (idempotent). Its callbacks never run after this returns.
  void close() {
    if (handle == nullptr) return;
    if (initialised) {
      auto* raw = reinterpret_cast<uv_handle_t*>(handle);
      raw->data = nullptr;
      if (!uv_is_closing(raw)) {
        uv_close(raw, [](uv_handle_t* h) { delete reinterpret_cast<H*>(h); });
      }
    } else {
      delete handle;
    }
    handle = nullptr;
  }

private:
  H* handle;
  bool initialised = false;
};

// Throws a kj exception describing a failed libuv call.
[[noreturn]] void throwUvError(const char* what, int status);

// Checks a libuv return code.
inline void checkUv(const char* what, int status) {
  if (status < 0) throwUvError(what, status);
}

}  // namespace troupe
