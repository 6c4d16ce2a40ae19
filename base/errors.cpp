#include "troupe/base/errors.h"

#include <errno.h>
#include <string.h>

#include <string_view>

#include <kj/debug.h>
#include <kj/vector.h>

namespace troupe {

namespace {

constexpr kj::StringPtr PREFIX = "troupe."_kj;

struct CodeInfo {
  ErrorCode code;
  kj::StringPtr name;
  kj::Exception::Type type;
  bool neverRan;
  bool retry;
};

constexpr CodeInfo CODES[] = {
    {ErrorCode::FAILED, "failed"_kj, kj::Exception::Type::FAILED, false, false},
    {ErrorCode::OVERLOADED, "overloaded"_kj, kj::Exception::Type::OVERLOADED, false, true},
    {ErrorCode::DISCONNECTED, "disconnected"_kj, kj::Exception::Type::DISCONNECTED, false, true},
    {ErrorCode::UNIMPLEMENTED, "unimplemented"_kj, kj::Exception::Type::UNIMPLEMENTED, false,
     false},
    {ErrorCode::ACTOR_NOT_FOUND, "actor_not_found"_kj, kj::Exception::Type::FAILED, true, true},
    {ErrorCode::DRAINING, "draining"_kj, kj::Exception::Type::OVERLOADED, true, true},
    {ErrorCode::UNREACHABLE, "unreachable"_kj, kj::Exception::Type::DISCONNECTED, true, true},
    {ErrorCode::DEADLINE_EXCEEDED, "deadline_exceeded"_kj, kj::Exception::Type::OVERLOADED, false,
     true},
    {ErrorCode::INVALID_ARGUMENT, "invalid_argument"_kj, kj::Exception::Type::FAILED, true, false},
    {ErrorCode::MESSAGE_TOO_LARGE, "message_too_large"_kj, kj::Exception::Type::FAILED, true,
     false},
    {ErrorCode::ADDRESS_IN_USE, "address_in_use"_kj, kj::Exception::Type::FAILED, true, false},
    {ErrorCode::JOB_ENDED, "job_ended"_kj, kj::Exception::Type::FAILED, true, false},
    {ErrorCode::NAME_TAKEN, "name_taken"_kj, kj::Exception::Type::FAILED, true, false},
    {ErrorCode::LEASE_LOST, "lease_lost"_kj, kj::Exception::Type::DISCONNECTED, true, true},
    {ErrorCode::NO_ENDPOINTS, "no_endpoints"_kj, kj::Exception::Type::OVERLOADED, true, true},
    {ErrorCode::MAY_HAVE_RUN, "may_have_run"_kj, kj::Exception::Type::DISCONNECTED, false, false},
    {ErrorCode::JOB_ALREADY_EXISTS, "job_already_exists"_kj, kj::Exception::Type::FAILED, true,
     false},
    {ErrorCode::UNAUTHENTICATED, "unauthenticated"_kj, kj::Exception::Type::FAILED, true, false},
    {ErrorCode::PERMISSION_DENIED, "permission_denied"_kj, kj::Exception::Type::FAILED, true,
     false},
    {ErrorCode::QUEUE_FULL, "queue_full"_kj, kj::Exception::Type::OVERLOADED, true, true},
    {ErrorCode::BLOB_REFUSED, "blob_refused"_kj, kj::Exception::Type::FAILED, true, false},
    {ErrorCode::BLOB_ABORTED, "blob_aborted"_kj, kj::Exception::Type::DISCONNECTED, false, true},
};

const CodeInfo& info(ErrorCode code) {
  for (auto& c : CODES) {
    if (c.code == code) return c;
  }
  KJ_FAIL_ASSERT("unknown error code", static_cast<int>(code));
}

ErrorCode codeOfType(kj::Exception::Type type) {
  switch (type) {
    case kj::Exception::Type::OVERLOADED:
      return ErrorCode::OVERLOADED;
    case kj::Exception::Type::DISCONNECTED:
      return ErrorCode::DISCONNECTED;
    case kj::Exception::Type::UNIMPLEMENTED:
      return ErrorCode::UNIMPLEMENTED;
    case kj::Exception::Type::FAILED:
      break;
  }
  return ErrorCode::FAILED;
}

bool contains(kj::StringPtr haystack, kj::StringPtr needle) {
  return std::string_view(haystack.begin(), haystack.size())
             .find(std::string_view(needle.begin(), needle.size())) != std::string_view::npos;
}

}  // namespace

namespace {

constexpr kj::StringPtr REMOTE = "remote exception: "_kj;

// The troupe code tagged at the very start of `text`, if any.
kj::Maybe<const CodeInfo&> taggedCode(kj::StringPtr text) {
  if (!text.startsWith(PREFIX)) return nullptr;
  kj::StringPtr rest = text.slice(PREFIX.size());
  for (auto& c : CODES) {
    if (rest.startsWith(c.name) && rest.size() > c.name.size() && rest[c.name.size()] == ':') {
      return c;
    }
  }
  return nullptr;
}

// The code troupe attached to `exception` itself: tagged at the start of an exception raised in
// this process, or right after the one "remote exception: " Cap'n Proto adds when the server
// that raised it answers. A tag found deeper was passed on by an actor from some other call and
// says nothing about this one; a tag whose code's type differs from the exception's is not ours.
kj::Maybe<const CodeInfo&> ownCode(const kj::Exception& exception) {
  kj::StringPtr text = exception.getDescription();
  if (text.startsWith(REMOTE)) text = text.slice(REMOTE.size());
  KJ_IF_MAYBE(c, taggedCode(text)) {
    if (c->type == exception.getType()) return *c;
  }
  return nullptr;
}

}  // namespace

ErrorCode errorCode(const kj::Exception& exception) {
  KJ_IF_MAYBE(c, ownCode(exception)) {
    return c->code;
  }
  kj::StringPtr text = exception.getDescription();
  // Cap'n Proto's own size checks, raised in this process: on an outgoing message, and in a
  // message reader.
  if (!text.startsWith(REMOTE) && (contains(text, "larger than our single-message size limit"_kj) ||
                                   contains(text, "Message is too large"_kj))) {
    return ErrorCode::MESSAGE_TOO_LARGE;
  }
  return codeOfType(exception.getType());
}

bool raisedByActor(const kj::Exception& exception) {
  if (!kj::StringPtr(exception.getDescription()).startsWith(REMOTE)) return false;
  return ownCode(exception) == nullptr;
}

kj::StringPtr errorCodeName(ErrorCode code) { return info(code).name; }

kj::Exception::Type errorType(ErrorCode code) { return info(code).type; }

bool callNeverRan(ErrorCode code) { return info(code).neverRan; }

bool mayRetry(ErrorCode code) { return info(code).retry; }

bool fromPeer(const kj::Exception& exception) {
  return kj::StringPtr(exception.getDescription()).startsWith(REMOTE);
}

kj::Exception asRaisedByActor(kj::Exception&& exception, kj::StringPtr actorName) {
  if (!kj::StringPtr(exception.getDescription()).startsWith(PREFIX)) return kj::mv(exception);
  kj::Exception renamed(exception.getType(), exception.getFile(), exception.getLine(),
                        kj::str("raised by actor '", actorName, "': ", exception.getDescription()));
  for (void* trace : exception.getStackTrace()) renamed.addTrace(trace);
  return renamed;
}

kj::StringPtr errorMessage(const kj::Exception& exception) {
  kj::StringPtr text = exception.getDescription();
  // A troupe error a peer sent comes as "remote exception: troupe.<code>: ...", with the
  // code's own type (errorCode()).
  size_t at = 0;
  if (text.startsWith(REMOTE)) {
    KJ_IF_MAYBE(c, taggedCode(text.slice(REMOTE.size()))) {
      if (c->type == exception.getType()) at = REMOTE.size();
    }
  }
  KJ_IF_MAYBE(c, taggedCode(text.slice(at))) {
    at += PREFIX.size() + c->name.size() + 1;
    if (at < text.size() && text[at] == ' ') ++at;
  }
  return text.slice(at);
}

namespace {

// Where the message proper starts in `text`: after the tags errorCode() and raisedByActor() read,
// "remote exception: " and "troupe.<code>: ".
size_t afterTags(kj::StringPtr text) {
  size_t at = 0;
  if (text.startsWith(REMOTE)) at = REMOTE.size();
  KJ_IF_MAYBE(c, taggedCode(text.slice(at))) {
    at += PREFIX.size() + c->name.size() + 1;
    if (at < text.size() && text[at] == ' ') ++at;
  }
  return at;
}

}  // namespace

kj::String messageWithout(const kj::Exception& exception, kj::StringPtr where) {
  kj::StringPtr text = exception.getDescription();
  size_t at = afterTags(text);
  auto context = kj::str(where, ": ");
  if (!text.slice(at).startsWith(context)) return kj::str(errorMessage(exception));
  auto tags = kj::arrayPtr(text.begin(), at);
  auto without = kj::str(tags, text.slice(at + context.size()));
  return kj::str(errorMessage(kj::Exception(exception.getType(), exception.getFile(),
                                            exception.getLine(), kj::mv(without))));
}

kj::Exception withContext(const kj::Exception& exception, kj::StringPtr where) {
  kj::StringPtr text = exception.getDescription();
  size_t at = afterTags(text);
  auto description = kj::str(kj::arrayPtr(text.begin(), at), where, ": ", text.slice(at));
  return kj::Exception(exception.getType(), exception.getFile(), exception.getLine(),
                       kj::mv(description));
}

kj::String printable(kj::ArrayPtr<const char> text) {
  constexpr size_t LIMIT = 160;
  kj::Vector<char> out;
  for (size_t i = 0; i < text.size() && i < LIMIT; ++i) {
    unsigned char c = text[i];
    if (c < 0x20 || c >= 0x7f) {
      auto escaped = kj::str(c < 0x10 ? "\\x0" : "\\x", kj::hex(c));
      out.addAll(escaped.asArray());
    } else {
      out.add(static_cast<char>(c));
    }
  }
  if (text.size() > LIMIT) out.addAll(kj::StringPtr("..."));
  return kj::heapString(out.begin(), out.size());
}

kj::Exception makeError(ErrorCode code, kj::StringPtr message, const char* file, int line) {
  auto& c = info(code);
  return kj::Exception(c.type, file, line, kj::str(PREFIX, c.name, ": ", message));
}

void throwError(ErrorCode code, kj::StringPtr message, const char* file, int line) {
  kj::throwFatalException(makeError(code, message, file, line));
}

kj::Exception syscallException(const char* what, int error, kj::StringPtr detail) {
  auto type = kj::Exception::Type::FAILED;
  switch (error) {
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EPIPE:
    case ENOTCONN:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
      type = kj::Exception::Type::DISCONNECTED;
      break;
    default:
      break;
  }
  auto text = detail == nullptr ? kj::str(what, ": ", strerror(error))
                                : kj::str(what, "(", detail, "): ", strerror(error));
  return kj::Exception(type, __FILE__, __LINE__, kj::mv(text));
}

}  // namespace troupe
