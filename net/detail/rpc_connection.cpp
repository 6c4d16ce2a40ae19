#include "troupe/net/detail/rpc_connection.h"

#include <capnp/message.h>

namespace troupe::net_detail {

RpcConnection::RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::Capability::Client bootstrap,
                             uint64_t maxMessageBytes, bool direct, kj::Maybe<ReadLimits> limits)
    : stream(kj::mv(stream)),
      messages(*this->stream, maxMessageBytes, direct, kj::mv(limits)),
      network(messages, capnp::rpc::twoparty::Side::SERVER, maxMessageBytes),
      rpc(capnp::makeRpcServer(network, kj::mv(bootstrap))) {}

RpcConnection::RpcConnection(kj::Own<kj::AsyncIoStream> stream, uint64_t maxMessageBytes,
                             bool direct)
    : stream(kj::mv(stream)),
      messages(*this->stream, maxMessageBytes, direct),
      network(messages, capnp::rpc::twoparty::Side::CLIENT, maxMessageBytes),
      rpc(capnp::makeRpcClient(network)) {}

capnp::Capability::Client RpcConnection::bootstrap() {
  capnp::word scratch[4];
  memset(scratch, 0, sizeof(scratch));
  capnp::MallocMessageBuilder message(scratch);
  auto vatId = message.getRoot<capnp::rpc::twoparty::VatId>();
  vatId.setSide(capnp::rpc::twoparty::Side::SERVER);
  return rpc.bootstrap(vatId);
}

}  // namespace troupe::net_detail
