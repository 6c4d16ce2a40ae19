#include "troupe/actor/endpoint.h"

#include <string.h>

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"
#include "troupe/net/same_host.h"

namespace troupe {

kj::StringPtr toString(EndpointState state) {
  switch (state) {
    case EndpointState::STARTING:
      return "starting";
    case EndpointState::READY:
      return "ready";
    case EndpointState::DRAINING:
      return "draining";
  }
  return "unknown";
}

schema::EndpointState toCapnp(EndpointState state) {
  switch (state) {
    case EndpointState::STARTING:
      return schema::EndpointState::STARTING;
    case EndpointState::READY:
      return schema::EndpointState::READY;
    case EndpointState::DRAINING:
      return schema::EndpointState::DRAINING;
  }
  return schema::EndpointState::STARTING;
}

EndpointState fromCapnp(schema::EndpointState state) {
  switch (state) {
    case schema::EndpointState::STARTING:
      return EndpointState::STARTING;
    case schema::EndpointState::READY:
      return EndpointState::READY;
    case schema::EndpointState::DRAINING:
      return EndpointState::DRAINING;
  }
  // A state added by a newer peer: treat it as not serving.
  return EndpointState::STARTING;
}

namespace {

// A text field from the wire. Refused (INVALID_ARGUMENT) when it holds a NUL byte, which a
// std::string would keep but kj::StringPtr, and every C API, would cut short: what troupe
// validates must be all there is.
std::string textField(capnp::Text::Reader text, kj::StringPtr field) {
  if (strlen(text.cStr()) != text.size()) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("the endpoint's ", field, " holds a NUL byte: '", printable(text), "'"));
  }
  return text;
}

bool isNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

bool isAlnum(char c) { return isNameChar(c) && c != '.' && c != '_' && c != '-'; }

// Empty when valid, else why not.
kj::String nameProblem(kj::StringPtr name) {
  if (name.size() == 0) return kj::str("is empty");
  if (name.size() > MAX_NAME_LENGTH) {
    return kj::str("is ", name.size(), " bytes long (the limit is ", MAX_NAME_LENGTH, ")");
  }
  if (!isAlnum(name[0])) return kj::str("must start with a letter or digit");
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = name[i];
    if (!isNameChar(c)) {
      if (c < 0x20 || c == 0x7f) {
        return kj::str("contains the control character 0x", kj::hex(c), " at byte ", i);
      }
      return kj::str("contains '", kj::StringPtr(name.begin() + i, 1), "' at byte ", i,
                     " (allowed: letters, digits, '.', '_', '-')");
    }
  }
  return kj::String();
}

}  // namespace

void Endpoint::toCapnp(schema::Endpoint::Builder builder) const {
  builder.setName(name);
  builder.setAddress(address);
  builder.setJobId(jobId);
  builder.setActor(actor);
  builder.setTaskIndex(taskIndex);
  builder.setIncarnation(incarnation);
  builder.setState(troupe::toCapnp(state));
  builder.setRegisteredAtMillis(registeredAtMillis);
  auto list = builder.initMetadata(metadata.size());
  size_t i = 0;
  for (auto& [key, value] : metadata) {
    list[i].setKey(key);
    list[i].setValue(value);
    ++i;
  }
}

Endpoint Endpoint::fromCapnp(schema::Endpoint::Reader reader) {
  Endpoint e;
  e.name = textField(reader.getName(), "name");
  e.address = textField(reader.getAddress(), "address");
  e.jobId = textField(reader.getJobId(), "job id");
  e.actor = textField(reader.getActor(), "actor");
  e.taskIndex = reader.getTaskIndex();
  e.incarnation = reader.getIncarnation();
  e.state = troupe::fromCapnp(reader.getState());
  e.registeredAtMillis = reader.getRegisteredAtMillis();
  for (auto entry : reader.getMetadata()) {
    e.metadata[textField(entry.getKey(), "metadata key")] = textField(entry.getValue(),
                                                                      "metadata value");
  }
  return e;
}

void validateJobId(kj::StringPtr jobId) {
  auto problem = nameProblem(jobId);
  if (problem.size() > 0) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("job id '", printable(jobId), "' ", problem));
  }
}

void validateActorName(kj::StringPtr actor) {
  auto problem = nameProblem(actor);
  if (problem.size() > 0) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("actor name '", printable(actor), "' ", problem));
  }
}

std::string endpointName(kj::StringPtr jobId, kj::StringPtr actor, uint32_t taskIndex) {
  validateJobId(jobId);
  validateActorName(actor);
  auto s = kj::str(jobId, '/', actor, '-', taskIndex);
  return std::string(s.cStr(), s.size());
}

bool fillNameParts(Endpoint& endpoint) {
  KJ_IF_MAYBE(parts, parseEndpointName(endpoint.name)) {
    endpoint.jobId = kj::mv(parts->jobId);
    endpoint.actor = kj::mv(parts->actor);
    endpoint.taskIndex = parts->taskIndex;
    return true;
  }
  return false;
}

kj::Maybe<EndpointNameParts> parseEndpointName(kj::StringPtr name) {
  KJ_IF_MAYBE(slash, name.findFirst('/')) {
    auto job = kj::heapString(name.slice(0, *slash));
    auto rest = name.slice(*slash + 1);
    KJ_IF_MAYBE(dash, rest.findLast('-')) {
      auto actor = kj::heapString(rest.slice(0, *dash));
      auto index = rest.slice(*dash + 1);
      // One spelling per index: no leading zeros.
      if (index.size() > 1 && index[0] == '0') return nullptr;
      uint64_t value = 0;
      KJ_IF_MAYBE(v, parseWholeNumber(index, UINT32_MAX)) {
        value = *v;
      } else {
        return nullptr;
      }
      if (nameProblem(job).size() > 0 || nameProblem(actor).size() > 0) return nullptr;
      return EndpointNameParts{std::string(job.cStr()), std::string(actor.cStr()),
                               static_cast<uint32_t>(value)};
    }
  }
  return nullptr;
}

kj::Exception endpointNameError(kj::StringPtr name) {
  return makeError(ErrorCode::INVALID_ARGUMENT,
                   kj::str("'", printable(name),
                           "' is not an endpoint name (expected <job_id>/<actor>-<task_index>, "
                           "with the job id and actor made of letters, digits, '.', '_' and '-')"));
}

std::string metadataOf(const Endpoint& endpoint, const std::string& key) {
  auto it = endpoint.metadata.find(key);
  return it == endpoint.metadata.end() ? "" : it->second;
}

std::string connectAddress(const Endpoint& endpoint) {
  return connectAddress(endpoint.address, metadataOf(endpoint, SAME_HOST_SOCKET_KEY),
                        metadataOf(endpoint, SAME_HOST_ID_KEY));
}

std::string connectAddress(const std::string& address, const std::string& sameHostSocket,
                           const std::string& sameHostIdOfIt) {
  if (sameHostSocket.empty() || sameHostIdOfIt.empty()) return address;
  // The id first: a path on another host may name a socket of this one.
  static const std::string here = sameHostId();
  if (here.empty() || sameHostIdOfIt != here || !isOwnSocket(sameHostSocket)) return address;
  return "unix:" + sameHostSocket;
}

}  // namespace troupe
