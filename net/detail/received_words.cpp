#include "troupe/net/detail/received_words.h"

#include <map>

#include <kj/mutex.h>

#include "troupe/net/bytes.h"

namespace troupe {

namespace net_detail {

namespace {

// Every ReceivedWords alive, by the address where its memory begins. Any thread.
struct Span {
  const kj::byte* end;
  const ReceivedWords* words;
};

kj::MutexGuarded<std::map<const kj::byte*, Span>>& registry() {
  static auto* spans = new kj::MutexGuarded<std::map<const kj::byte*, Span>>();
  return *spans;  // never destroyed: a message may be let go of during the process's exit
}

}  // namespace

ReceivedWords::ReceivedWords(kj::Array<capnp::word> words) : words(kj::mv(words)) {
  auto bytes = this->words.asBytes();
  registry().lockExclusive()->emplace(bytes.begin(), Span{bytes.end(), this});
}

ReceivedWords::~ReceivedWords() noexcept(false) {
  auto spans = registry().lockExclusive();
  if (!hidden) spans->erase(words.asBytes().begin());
}

bool ReceivedWords::keptElseHide() const {
  auto spans = registry().lockExclusive();
  if (kept) return true;
  if (!hidden) spans->erase(words.asBytes().begin());
  hidden = true;
  return false;
}

}  // namespace net_detail

kj::Maybe<kj::Array<kj::byte>> keepReceivedBytes(kj::ArrayPtr<const kj::byte> data) {
  if (data.size() == 0) return nullptr;
  kj::Maybe<kj::Own<const net_detail::ReceivedWords>> owner;
  {
    auto spans = net_detail::registry().lockExclusive();
    auto after = spans->upper_bound(data.begin());
    if (after == spans->begin()) return nullptr;
    auto& span = std::prev(after)->second;
    if (data.end() > span.end) return nullptr;
    // Null when the last holder is letting go right now: its memory is leaving.
    owner = kj::atomicAddRefWeak(*span.words);
    if (owner != nullptr) span.words->kept = true;
  }
  KJ_IF_MAYBE(o, owner) {
    // The message's own memory, private to this process: writing it harms no one.
    auto* begin = const_cast<kj::byte*>(data.begin());
    return kj::ArrayPtr<kj::byte>(begin, data.size()).attach(kj::mv(*o));
  }
  return nullptr;
}

}  // namespace troupe
