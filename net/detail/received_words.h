#pragma once
// The memory of a large received message, shared with whoever keeps a Data value of it past the
// message (keepReceivedBytes(), bytes.h), and found again from any address inside it.

#include <capnp/common.h>
#include <kj/array.h>
#include <kj/refcount.h>

namespace troupe::net_detail {

// `words`, findable by address while anyone holds them. Freed by whoever lets go last, on any
// thread.
class ReceivedWords final : public kj::AtomicRefcounted {
public:
  explicit ReceivedWords(kj::Array<capnp::word> words);
  ~ReceivedWords() noexcept(false);
  KJ_DISALLOW_COPY(ReceivedWords);

  kj::ArrayPtr<const capnp::word> get() const { return words; }

private:
  kj::Array<capnp::word> words;
};

}  // namespace troupe::net_detail
