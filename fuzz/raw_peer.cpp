#include "fuzz/raw_peer.h"

#include <stdlib.h>
#include <unistd.h>

#include <kj/debug.h>

#include "troupe/net/address.h"
#include "fuzz/fuzz_support.h"

namespace troupe::fuzz {

namespace {

kj::Promise<kj::Array<kj::byte>> exchange(kj::Own<kj::AsyncIoStream> stream,
                                          kj::ArrayPtr<const kj::byte> bytes) {
  // Reading starts at once: a server that answers as it reads must never wait on a full socket.
  auto answer = stream->readAllBytes()
                    .catch_([](kj::Exception&&) { return kj::Array<kj::byte>(); })
                    .eagerlyEvaluate(nullptr);
  auto sent = stream->write(bytes.begin(), bytes.size())
                  .then([&stream = *stream]() { stream.shutdownWrite(); })
                  .catch_([](kj::Exception&&) {});
  return sent.then([answer = kj::mv(answer)]() mutable { return kj::mv(answer); })
      .attach(kj::mv(stream));
}

}  // namespace

kj::Array<kj::byte> exchangeRaw(EventLoop& loop, kj::NetworkAddress& server,
                                kj::ArrayPtr<const kj::byte> bytes) {
  auto done = server.connect().then(
      [bytes](kj::Own<kj::AsyncIoStream> stream) { return exchange(kj::mv(stream), bytes); });
  auto bounded = loop.timer().timeoutAfter(CLOSE_TIMEOUT, kj::mv(done));
  kj::Array<kj::byte> answer;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { answer = bounded.wait(loop.waitScope()); })) {
    fprintf(stderr, "fuzz: %s\n", e->getDescription().cStr());
    check(false, "the server did not take a connection, or kept it open after its peer was done");
  }
  return answer;
}

std::string privateSocketAddress() {
  static std::string folder;
  KJ_REQUIRE(folder.empty(), "one private socket per process");
  char name[] = "/tmp/troupe-fuzz-XXXXXX";
  KJ_SYSCALL(mkdtemp(name) != nullptr ? 0 : -1, "mkdtemp");
  folder = name;
  // libFuzzer ends the process with exit(), crashes included, so this runs for every normal end.
  atexit([]() {
    unlink((folder + "/server").c_str());
    rmdir(folder.c_str());
  });
  return "unix:" + folder + "/server";
}

kj::Own<kj::NetworkAddress> rawAddress(EventLoop& loop, kj::StringPtr address) {
  return loop.network().parseAddress(Address::parse(address).toKjAddress()).wait(loop.waitScope());
}

}  // namespace troupe::fuzz
