#pragma once
// The echo actor every troupe benchmark server hosts: it copies the request's payload into its
// results, sized so that a large payload lands in one segment, as the Cap'n Proto peer does; and
// take() answers with the payload's size.

#include <capnp/message.h>

#include "bench_echo.capnp.h"

namespace troupe::bench {

class EchoImpl final : public BenchEcho::Server {
protected:
  kj::Promise<void> echo(EchoContext context) override {
    auto in = context.getParams().getPayload();
    context.getResults(capnp::MessageSize{in.size() / sizeof(capnp::word) + 8, 0}).setPayload(in);
    return kj::READY_NOW;
  }

  kj::Promise<void> take(TakeContext context) override {
    context.getResults().setSize(context.getParams().getPayload().size());
    return kj::READY_NOW;
  }
};

}  // namespace troupe::bench
