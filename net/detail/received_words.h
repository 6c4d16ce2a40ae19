#pragma once
// The memory of a large received message, shared with whoever keeps a Data value of it past the
// message (keepReceivedBytes(), bytes.h), and found again from any address inside it.

#include <capnp/common.h>
#include <kj/array.h>
#include <kj/refcount.h>

namespace troupe {

kj::Maybe<kj::Array<kj::byte>> keepReceivedBytes(kj::ArrayPtr<const kj::byte> data);

namespace net_detail {

// `words`, findable by address while anyone holds them. Freed by whoever lets go last, on any
// thread.
class ReceivedWords final : public kj::AtomicRefcounted {
public:
  explicit ReceivedWords(kj::Array<capnp::word> words);
  ~ReceivedWords() noexcept(false);
  KJ_DISALLOW_COPY(ReceivedWords);

  kj::ArrayPtr<const capnp::word> get() const { return words; }

  // Whether keepReceivedBytes() ever handed out bytes of it (whoever got them may have written
  // them, or may still hold them). When it did not, takes it out of what keepReceivedBytes()
  // finds, now rather than when it is freed, so that the answer is final; when it did, it stays
  // findable (a kept copy that refers to it may be kept again) until freed.
  bool keptElseHide() const;

private:
  kj::Array<capnp::word> words;
  // Both under the registry's lock.
  mutable bool hidden = false;
  mutable bool kept = false;

  friend kj::Maybe<kj::Array<kj::byte>> troupe::keepReceivedBytes(kj::ArrayPtr<const kj::byte>);
};

}  // namespace net_detail
}  // namespace troupe
