#pragma once
// The receiving side of blobs (blob.h) for an ActorServer: the names it accepts blobs under,
// the transfers in progress, and ActorHost.receiveBlob.

#include <map>
#include <memory>
#include <string>

#include <kj/async.h>
#include <spdlog/logger.h>

#include "troupe/actor/blob.h"
#include "troupe/base/event_loop.h"
#include "troupe/net/channel.h"
#include "troupe/net/same_host.h"
#include "troupe/net/segment_placement.h"
#include "troupe/schemas/actor.capnp.h"

namespace troupe::actor_detail {

// Loop thread only. Belongs to its server; destroying it gives up every transfer in progress.
// As its server's SegmentPlacement, it has the chunks of a transfer read straight into their
// place in the blob (found by transfer id and offset: only the next chunk due, and only where it
// fits exactly); a chunk placed so is checked like any other when its write is served.
class BlobReceiver final : public SegmentPlacement, private kj::TaskSet::ErrorHandler {
public:
  // `forwarding` is what connections to the members a blob is forwarded to use; `who` names the
  // server in logs and errors.
  BlobReceiver(EventLoop& loop, ChannelOptions forwarding, std::shared_ptr<spdlog::logger> log,
               kj::Function<kj::String()> who);
  ~BlobReceiver() noexcept(false);
  KJ_DISALLOW_COPY(BlobReceiver);

  // ActorServer::acceptBlobs. Throws INVALID_ARGUMENT for a bad or taken name.
  void accept(kj::StringPtr name, BlobAllocator allocate, BlobHandler handle,
              BlobAcceptOptions options);

  // ActorHost.receiveBlob: starts or resumes a transfer; resolves once its results hold the
  // sink (a resume waits for chunks of the old sender still being read in). `peer`: the client
  // that sent it, where it is a process of this user on this host (only its own memory is read,
  // where it offers it); else null.
  using ReceiveContext = capnp::CallContext<schema::ActorHost::ReceiveBlobParams,
                                            schema::ActorHost::ReceiveBlobResults>;
  kj::Promise<void> receive(ReceiveContext context, std::shared_ptr<const LocalPeer> peer);

  // Gives up every transfer (its server stopped): each frees its memory once nothing refers to
  // it, and forwards no more.
  void stop();

  // Transfers in progress or finished and still remembered, for tests and metrics.
  size_t transferCount() const;
  // Bytes read straight from senders' memory on this host (BlobSendOptions::sameHostReads).
  uint64_t bytesReadFromSenders() const { return bytesRead; }

  // SegmentPlacement.
  kj::Maybe<kj::Array<capnp::word>> place(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> head,
                                          size_t lastWords) override;

  struct Acceptor;
  class Transfer;

private:
  void taskFailed(kj::Exception&& e) override;
  // The acceptor of blobs named as `header` is; throws BLOB_REFUSED naming those there are.
  Acceptor& acceptorFor(const BlobHeader& header);
  // Throws what refuses a new transfer of `header` (`h` on the wire) to `acceptor`: its chunking,
  // its size, a version older than one delivered or in progress. Returns the transfer in
  // progress of an older version, which the new one supersedes.
  kj::Maybe<Transfer&> checkNewTransfer(Acceptor& acceptor, const BlobHeader& header,
                                        schema::BlobHeader::Reader h);

  EventLoop& loop;
  ChannelOptions forwarding;
  std::shared_ptr<spdlog::logger> log;
  kj::Function<kj::String()> who;
  std::map<std::string, kj::Own<Acceptor>> acceptors;
  std::map<uint64_t, Transfer*> byId;  // transfers in the acceptors' records, for place()
  uint64_t bytesRead = 0;
  kj::Own<kj::TaskSet> tasks;  // records of transfers being dropped
};

}  // namespace troupe::actor_detail
