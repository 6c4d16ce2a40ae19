#include "troupe/actor/endpoint.h"

#include <kj/debug.h>

#include "troupe/actor/errors.h"
#include "troupe/actor/parse_number.h"

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

kj::StringPtr asPtr(const std::string& s) { return kj::StringPtr(s.c_str(), s.size()); }

std::string fromText(capnp::Text::Reader text) { return std::string(text.begin(), text.size()); }

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
  builder.setName(asPtr(name));
  builder.setAddress(asPtr(address));
  builder.setJobId(asPtr(jobId));
  builder.setActor(asPtr(actor));
  builder.setTaskIndex(taskIndex);
  builder.setIncarnation(incarnation);
  builder.setState(troupe::toCapnp(state));
  builder.setRegisteredAtMillis(registeredAtMillis);
  auto list = builder.initMetadata(metadata.size());
  size_t i = 0;
  for (auto& [key, value] : metadata) {
    list[i].setKey(asPtr(key));
    list[i].setValue(asPtr(value));
    ++i;
  }
}

Endpoint Endpoint::fromCapnp(schema::Endpoint::Reader reader) {
  Endpoint e;
  e.name = fromText(reader.getName());
  e.address = fromText(reader.getAddress());
  e.jobId = fromText(reader.getJobId());
  e.actor = fromText(reader.getActor());
  e.taskIndex = reader.getTaskIndex();
  e.incarnation = reader.getIncarnation();
  e.state = troupe::fromCapnp(reader.getState());
  e.registeredAtMillis = reader.getRegisteredAtMillis();
  for (auto entry : reader.getMetadata()) {
    e.metadata[fromText(entry.getKey())] = fromText(entry.getValue());
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

}  // namespace troupe
