#include "troupe/resolver/detail/registry_job_control.h"

#include <openssl/crypto.h>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"

namespace troupe::resolver_detail {

namespace {

class JobControlServer final : public schema::JobControl::Server {
public:
  explicit JobControlServer(kj::Own<ControlSlot> slot) : slot(kj::mv(slot)) {}

protected:
  kj::Promise<void> stop(StopContext context) override {
    auto grace = context.getParams().getGraceMillis() * kj::MILLISECONDS;
    return control().stop(grace);
  }

  kj::Promise<void> readLog(ReadLogContext context) override {
    auto params = context.getParams();
    auto maxBytes = kj::min(params.getMaxBytes(), MAX_LOG_PIECE_BYTES);
    return control()
        .readLog(params.getReplica(), params.getOffset(), maxBytes)
        .then([context](LogPiece piece) mutable {
          auto words = piece.data.size() / sizeof(capnp::word) + 16;
          auto out = context.initResults(capnp::MessageSize{words, 0}).initPiece();
          out.setData(kj::StringPtr(piece.data).asBytes());
          out.setNext(piece.next);
          out.setSize(piece.size);
          out.setReplicas(piece.replicas);
        });
  }

  kj::Promise<void> describe(DescribeContext context) override {
    return control().describe().then([context](JobDetail detail) mutable {
      auto out = context.getResults().initJob();
      out.setResources(detail.resources);
      out.setPhase(detail.phase);
      auto replicas = out.initReplicas(static_cast<uint32_t>(detail.replicas.size()));
      for (uint32_t i = 0; i < replicas.size(); ++i) {
        auto& r = detail.replicas[i];
        auto b = replicas[i];
        b.setIndex(r.index);
        b.setState(r.state);
        b.setPid(r.pid);
        b.setHost(r.host);
        b.setRestarts(r.restarts);
      }
    });
  }

private:
  JobControl& control() {
    KJ_IF_MAYBE(c, slot->control) {
      return **c;
    }
    throwError(ErrorCode::DISCONNECTED, "the launcher no longer serves this job");
  }

  kj::Own<ControlSlot> slot;
};

}  // namespace

schema::JobControl::Client jobControlCapability(kj::Own<ControlSlot> slot) {
  return kj::heap<JobControlServer>(kj::mv(slot));
}

RegistryJobControlOffer::RegistryJobControlOffer(kj::Own<RegistryLink> link, std::string jobId,
                                                 std::string credential, std::string logLocation,
                                                 kj::Own<JobControl> control)
    : link(kj::mv(link)),
      jobId(kj::mv(jobId)),
      credential(kj::mv(credential)),
      logLocation(kj::mv(logLocation)),
      slot(kj::refcounted<ControlSlot>()),
      tasks(kj::heap<kj::TaskSet>(*this)) {
  slot->control = kj::mv(control);
  this->link->addListener(*this);
  offer(0);
}

RegistryJobControlOffer::~RegistryJobControlOffer() noexcept(false) {
  slot->control = nullptr;
  link->removeListener(*this);
  OPENSSL_cleanse(credential.data(), credential.size());
}

void RegistryJobControlOffer::connectionLost() { offer(0); }

void RegistryJobControlOffer::offer(uint32_t attempt) {
  using Response = capnp::Response<schema::Registry::ServeJobControlResults>;
  auto sent = link->call<Response>("serveJobControl", [this](schema::Registry::Client registry) {
    auto request = registry.serveJobControlRequest();
    request.setJobId(jobId);
    request.setControl(jobControlCapability(kj::addRef(*slot)));
    request.setLogLocation(logLocation);
    request.setJobCredential(kj::StringPtr(credential).asBytes());
    return request.send();
  });
  tasks->add(sent.then(
      [this](Response&&) -> kj::Promise<void> {
        link->ensureProbe();
        return kj::READY_NOW;
      },
      [this, attempt](kj::Exception&& e) -> kj::Promise<void> {
        auto code = errorCode(e);
        if (code == ErrorCode::PERMISSION_DENIED || code == ErrorCode::INVALID_ARGUMENT) {
          link->log->warn("job {}: the registry refused to relay stop and logs to this "
                          "launcher: {}",
                          jobId, e.getDescription().cStr());
          return kj::READY_NOW;
        }
        return link->loop.timer().afterDelay(link->backoff(attempt)).then([this, attempt]() {
          offer(attempt + 1);
        });
      }));
}

void RegistryJobControlOffer::taskFailed(kj::Exception&& exception) {
  link->log->warn("job {}: offering its control to the registry failed: {}", jobId,
                  exception.getDescription().cStr());
}

}  // namespace troupe::resolver_detail
