#include "troupe/net/detail/tls_sniff.h"

#include <string.h>

#include "troupe/net/detail/rpc_network.h"

namespace troupe::net_detail {

namespace {

constexpr kj::byte TLS_HANDSHAKE_RECORD = 0x16;

// `inner` with one byte already read from it put back in front.
class Unread final : public kj::AsyncIoStream {
public:
  Unread(kj::Own<kj::AsyncIoStream> inner, kj::byte first) : inner(kj::mv(inner)), first(first) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override {
    if (pending && maxBytes > 0) {
      pending = false;
      *reinterpret_cast<kj::byte*>(buffer) = first;
      if (minBytes <= 1) return size_t(1);
      return inner->tryRead(reinterpret_cast<kj::byte*>(buffer) + 1, minBytes - 1, maxBytes - 1)
          .then([](size_t n) { return n + 1; });
    }
    return inner->tryRead(buffer, minBytes, maxBytes);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner->whenWriteDisconnected(); }
  void shutdownWrite() override { inner->shutdownWrite(); }
  void abortRead() override { inner->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override {
    inner->getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, kj::uint* length) override {
    inner->getpeername(addr, length);
  }
  kj::Maybe<int> getFd() const override { return inner->getFd(); }

private:
  kj::Own<kj::AsyncIoStream> inner;
  kj::byte first;
  bool pending = true;
};

}  // namespace

kj::Promise<kj::Maybe<kj::Own<kj::AsyncIoStream>>> sniffTls(kj::Own<kj::AsyncIoStream> stream,
                                                            kj::StringPtr tlsAddress) {
  auto first = kj::heap<kj::byte>(0);
  auto& stream_ = *stream;
  auto& byte = *first;
  return stream_.tryRead(&byte, 1, 1)
      .then([stream = kj::mv(stream), first = kj::mv(first), address = kj::str(tlsAddress)](
                size_t n) mutable -> kj::Promise<kj::Maybe<kj::Own<kj::AsyncIoStream>>> {
        if (n == 0) return kj::Maybe<kj::Own<kj::AsyncIoStream>>(nullptr);
        if (*first == TLS_HANDSHAKE_RECORD) {
          return kj::Maybe<kj::Own<kj::AsyncIoStream>>(kj::heap<Unread>(kj::mv(stream), *first));
        }
        // A plain Cap'n Proto peer: tell it why, in words its RPC system reports to its callers.
        auto& out = *stream;
        return writeAbort(out, kj::str("troupe.unreachable: this server speaks TLS: connect to ",
                                       address))
            .then([&out]() { out.shutdownWrite(); })
            .catch_([](kj::Exception&&) {})
            .attach(kj::mv(stream))
            .then([]() { return kj::Maybe<kj::Own<kj::AsyncIoStream>>(nullptr); });
      });
}

}  // namespace troupe::net_detail
