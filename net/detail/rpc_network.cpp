#include "troupe/net/detail/rpc_network.h"

#include <string.h>

#include <algorithm>

#include <capnp/rpc.capnp.h>
#include <capnp/serialize-async.h>
#include <kj/debug.h>

#include "troupe/base/buffer_cache.h"
#include "troupe/net/bytes.h"
#include "troupe/net/limits.h"

namespace troupe::net_detail {

namespace {

using capnp::word;

// Cap'n Proto's largest segment.
constexpr uint MAX_SEGMENT_WORDS = (1u << 29) - 1;

// A MessageBuilder with MallocMessageBuilder's growth (each new segment at least as large as
// the message so far). A small first segment comes from the thread's pool of zeroed blocks and
// goes back with only the words the message used zeroed again; large segments come from the
// thread's buffer cache.
class SegmentBuilder final : public capnp::MessageBuilder {
public:
  explicit SegmentBuilder(uint firstSegmentWords)
      : nextSize(firstSegmentWords == 0 ? capnp::SUGGESTED_FIRST_SEGMENT_WORDS
                                        : firstSegmentWords) {}

  ~SegmentBuilder() noexcept(false) {
    if (pooled) {
      // Everything the builder wrote lies in the part of the segment it allocated.
      auto used = getSegmentsForOutput()[0];
      memset(static_cast<void*>(first.begin()), 0, used.size() * sizeof(word));
    }
  }

  kj::ArrayPtr<word> allocateSegment(uint minimumSize) override {
    uint size = std::max(minimumSize, nextSize);
    kj::Array<word> memory;
    if (first == nullptr && size <= SMALL_SEGMENT_WORDS) {
      memory = takeZeroedSegment();
      pooled = true;
    } else {
      memory = takeMessageBuffer(size);
      memset(static_cast<void*>(memory.begin()), 0, memory.asBytes().size());  // as builders need
    }
    nextSize = static_cast<uint>(
        std::min<uint64_t>(uint64_t{nextSize} + memory.size(), MAX_SEGMENT_WORDS));
    kj::ArrayPtr<word> result = memory;
    if (first == nullptr) {
      first = kj::mv(memory);
    } else {
      more.add(kj::mv(memory));
    }
    return result;
  }

  // The words of every segment allocated, used or not.
  size_t capacityWords() const {
    size_t words = first.size();
    for (auto& segment : more) words += segment.size();
    return words;
  }

  // Whether `address` lies in memory this builder allocated.
  bool owns(const void* address) const {
    auto inside = [address](const kj::Array<word>& segment) {
      auto* p = static_cast<const word*>(address);
      return p >= segment.begin() && p < segment.end();
    };
    if (first == nullptr) return false;
    if (inside(first)) return true;
    for (auto& segment : more) {
      if (inside(segment)) return true;
    }
    return false;
  }

private:
  uint nextSize;
  bool pooled = false;    // `first` is a pooled zeroed block
  kj::Array<word> first;  // most messages have one segment: no vector for them
  kj::Vector<kj::Array<word>> more;
};

}  // namespace

// The outgoing messages alive on this thread, for attachToOutgoingMessage(): a list threaded
// through the messages themselves.
class RpcNetwork::OutgoingMessage final : public capnp::OutgoingRpcMessage, public kj::Refcounted {
public:
  OutgoingMessage(RpcNetwork& network, uint firstSegmentWords)
      : network(network), message(firstSegmentWords) {
    next = live;
    if (next != nullptr) next->prev = this;
    live = this;
  }
  ~OutgoingMessage() noexcept(false) { unlink(); }

  // Takes the message out of those containing() finds.
  void unlink() {
    if (prev != nullptr) prev->next = next;
    if (next != nullptr) next->prev = prev;
    if (live == this) live = next;
    prev = next = nullptr;
  }

  capnp::AnyPointer::Builder getBody() override { return message.getRoot<capnp::AnyPointer>(); }
  void send() override { network.send(*this); }
  size_t sizeInWords() override { return message.sizeInWords(); }

  static kj::Maybe<OutgoingMessage&> containing(const void* address) {
    for (auto* m = live; m != nullptr; m = m->next) {
      if (m->message.owns(address)) return *m;
    }
    return nullptr;
  }

  RpcNetwork& network;
  kj::Vector<kj::Array<const kj::byte>> attachments;  // memory the message points at
  SegmentBuilder message;

private:
  static thread_local OutgoingMessage* live;
  OutgoingMessage* prev = nullptr;
  OutgoingMessage* next = nullptr;
};

thread_local RpcNetwork::OutgoingMessage* RpcNetwork::OutgoingMessage::live = nullptr;

}  // namespace troupe::net_detail

namespace troupe {

bool attachToOutgoingMessage(const void* address, kj::Array<const kj::byte>& bytes) {
  KJ_IF_MAYBE(m, net_detail::RpcNetwork::OutgoingMessage::containing(address)) {
    m->attachments.add(kj::mv(bytes));
    return true;
  }
  return false;
}

kj::Maybe<RetainedMessage> retainOutgoingMessage(const void* address) {
  KJ_IF_MAYBE(m, net_detail::RpcNetwork::OutgoingMessage::containing(address)) {
    if (!m->attachments.empty()) return nullptr;
    m->unlink();
    return RetainedMessage{kj::Own<void>(kj::addRef(*m)),
                           sizeof(*m) + m->message.capacityWords() * sizeof(capnp::word)};
  }
  return nullptr;
}

}  // namespace troupe

namespace troupe::net_detail {

namespace {

capnp::ReaderOptions readerOptions(uint64_t maxMessageBytes) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = maxMessageBytes / sizeof(word);
  return options;
}

}  // namespace

RpcNetwork::RpcNetwork(BoundedMessageStream& messages, capnp::rpc::twoparty::Side side,
                       uint64_t maxMessageBytes)
    : messages(messages),
      side(side),
      maxMessageBytes(maxMessageBytes),
      receiveOptions(readerOptions(maxMessageBytes)),
      peerVatId(4),
      connectionDisposer(*this),
      disconnected(nullptr),
      largeWrites(*this) {
  peerVatId.initRoot<capnp::rpc::twoparty::VatId>().setSide(
      side == capnp::rpc::twoparty::Side::CLIENT ? capnp::rpc::twoparty::Side::SERVER
                                                 : capnp::rpc::twoparty::Side::CLIENT);
  auto paf = kj::newPromiseAndFulfiller<void>();
  disconnected = paf.promise.fork();
  disconnectFulfiller = kj::mv(paf.fulfiller);
}

RpcNetwork::~RpcNetwork() noexcept(false) {}

void RpcNetwork::ConnectionDisposer::disposeImpl(void*) const {
  if (--network.connectionRefs == 0) network.disconnectFulfiller->fulfill();
}

kj::Own<capnp::TwoPartyVatNetworkBase::Connection> RpcNetwork::asConnection() {
  ++connectionRefs;
  return kj::Own<capnp::TwoPartyVatNetworkBase::Connection>(this, connectionDisposer);
}

kj::Maybe<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>> RpcNetwork::connect(
    capnp::rpc::twoparty::VatId::Reader ref) {
  if (ref.getSide() == side) return nullptr;  // that is us
  return asConnection();
}

kj::Promise<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>> RpcNetwork::accept() {
  if (side == capnp::rpc::twoparty::Side::SERVER && !accepted) {
    accepted = true;
    return asConnection();
  }
  // Only one peer ever connects: later accepts wait forever.
  auto paf = kj::newPromiseAndFulfiller<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>>();
  acceptFulfiller = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

void RpcNetwork::send(OutgoingMessage& message) {
  KJ_REQUIRE(!shutDown, "message sent after the connection was shut down");
  auto segments = message.message.getSegmentsForOutput();
  uint64_t bytes = 0;
  for (auto& s : segments) bytes += s.size() * sizeof(word);
  if (bytes > maxMessageBytes) kj::throwFatalException(messageTooLarge(bytes, maxMessageBytes));
  KJ_IF_MAYBE(write, messages.queueMessage(segments)) {
    largeWrites.add(write->attach(kj::addRef(message)));
  }
}

kj::Own<capnp::RpcFlowController> RpcNetwork::newStream() {
  return capnp::RpcFlowController::newVariableWindowController(*this);
}

size_t RpcNetwork::getWindow() {
  KJ_IF_MAYBE(size, messages.getSendBufferSize()) {
    if (*size > 0) return *size;
  }
  return capnp::RpcFlowController::DEFAULT_WINDOW_SIZE;
}

capnp::rpc::twoparty::VatId::Reader RpcNetwork::getPeerVatId() {
  return peerVatId.getRoot<capnp::rpc::twoparty::VatId>();
}

kj::Own<capnp::OutgoingRpcMessage> RpcNetwork::newOutgoingMessage(uint firstSegmentWordSize) {
  return kj::refcounted<OutgoingMessage>(*this, firstSegmentWordSize);
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> RpcNetwork::receiveIncomingMessage() {
  return messages.readMessage(receiveOptions);
}

kj::Promise<void> RpcNetwork::shutdown() {
  KJ_REQUIRE(!shutDown, "connection shut down twice");
  shutDown = true;
  return messages.end();
}

void RpcNetwork::taskFailed(kj::Exception&&) {
  // A failed write: the socket is closing, and the connection's reads report it.
}

kj::Promise<void> writeAbort(kj::AsyncOutputStream& stream, kj::StringPtr reason) {
  auto message = kj::heap<capnp::MallocMessageBuilder>();
  auto abort = message->initRoot<capnp::rpc::Message>().initAbort();
  abort.setType(capnp::rpc::Exception::Type::DISCONNECTED);
  abort.setReason(reason);
  auto& built = *message;
  return capnp::writeMessage(stream, built).attach(kj::mv(message));
}

}  // namespace troupe::net_detail
