#include "tools/troupe/call_json.h"

#include <capnp/message.h>
#include <kj/debug.h>
#include <kj/encoding.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"
#include "tools/troupe/dynamic_actor.h"

namespace troupe::cli {

namespace {

// A recursive-descent check of JSON's grammar that says where the text goes wrong.
class SyntaxCheck {
public:
  explicit SyntaxCheck(kj::ArrayPtr<const char> text)
      : begin(text.begin()), at(text.begin()), end(text.end()) {}

  kj::Maybe<kj::String> run() {
    if (value() && (space(), at == end || expected("nothing more"))) return nullptr;
    return kj::mv(error);
  }

private:
  bool value() {
    space();
    if (at == end) return expected("a value");
    switch (*at) {
      case '{':
        return object();
      case '[':
        return array();
      case '"':
        return string();
      case 't':
        return word("true");
      case 'f':
        return word("false");
      case 'n':
        return word("null");
      default:
        if (*at == '-' || isDigit(*at)) return number();
        return expected("a value");
    }
  }

  bool object() {
    ++at;
    space();
    if (at != end && *at == '}') return ++at, true;
    for (;;) {
      space();
      if (at == end || *at != '"') return expected("a field name in double quotes");
      if (!string()) return false;
      space();
      if (at == end || *at != ':') return expected("':'");
      ++at;
      if (!value()) return false;
      space();
      if (at != end && *at == ',') {
        ++at;
        continue;
      }
      if (at != end && *at == '}') return ++at, true;
      return expected("',' or '}'");
    }
  }

  bool array() {
    ++at;
    space();
    if (at != end && *at == ']') return ++at, true;
    for (;;) {
      if (!value()) return false;
      space();
      if (at != end && *at == ',') {
        ++at;
        continue;
      }
      if (at != end && *at == ']') return ++at, true;
      return expected("',' or ']'");
    }
  }

  bool string() {
    ++at;
    while (at != end && *at != '"') {
      auto c = static_cast<unsigned char>(*at);
      if (c < 0x20) return expected("an escape (\\n, \\t, ...) instead of a control character");
      if (c == '\\') {
        ++at;
        if (at == end) break;
        if (*at == 'u') {
          for (int i = 0; i < 4; ++i) {
            ++at;
            if (at == end || !isHex(*at)) return expected("4 hex digits after \\u");
          }
        } else if (kj::StringPtr("\"\\/bfnrt").findFirst(*at) == nullptr) {
          return expected("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
        }
      }
      ++at;
    }
    if (at == end) return expected("a closing '\"'");
    ++at;
    return true;
  }

  bool number() {
    if (*at == '-') ++at;
    if (at == end || !isDigit(*at)) return expected("a digit");
    if (*at == '0') {
      ++at;
    } else {
      while (at != end && isDigit(*at)) ++at;
    }
    if (at != end && *at == '.') {
      ++at;
      if (at == end || !isDigit(*at)) return expected("a digit after '.'");
      while (at != end && isDigit(*at)) ++at;
    }
    if (at != end && (*at == 'e' || *at == 'E')) {
      ++at;
      if (at != end && (*at == '+' || *at == '-')) ++at;
      if (at == end || !isDigit(*at)) return expected("a digit in the exponent");
      while (at != end && isDigit(*at)) ++at;
    }
    return true;
  }

  bool word(kj::StringPtr text) {
    auto start = at;
    for (char c : text) {
      if (at == end || *at != c) {
        at = start;  // "nope" is no value at all, rather than a misspelt null
        return expected("a value");
      }
      ++at;
    }
    return true;
  }

  void space() {
    while (at != end && (*at == ' ' || *at == '\t' || *at == '\n' || *at == '\r')) ++at;
  }

  // Records what should have been at `at`; returns false.
  bool expected(kj::StringPtr what) {
    if (at == end) {
      error = kj::str("it ends where ", what, " should be");
    } else {
      error = kj::str("'", printable(kj::arrayPtr(at, 1)), "' at byte ", at - begin + 1, " where ",
                      what, " should be");
    }
    return false;
  }

  static bool isHex(char c) {
    return isDigit(c) || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F');
  }

  const char* begin;
  const char* at;
  const char* end;
  kj::Maybe<kj::String> error;
};

// "a, b" or "none": the parameters of a method, for a message.
kj::String fieldNames(capnp::StructSchema schema) {
  kj::Vector<kj::StringPtr> names;
  for (auto field : schema.getFields()) names.add(field.getProto().getName());
  if (names.empty()) return kj::str("none");
  return kj::strArray(names, ", ");
}

}  // namespace

void Base64DataHandler::encode(const capnp::JsonCodec&, capnp::Data::Reader input,
                               capnp::JsonValue::Builder output) const {
  output.setString(kj::encodeBase64(input));
}

capnp::Orphan<capnp::Data> Base64DataHandler::decode(const capnp::JsonCodec&,
                                                     capnp::JsonValue::Reader input,
                                                     capnp::Orphanage orphanage) const {
  KJ_REQUIRE(input.isString(), "Data is a base64 string");
  auto text = kj::heapString(input.getString());
  for (auto& c : text) {
    if (c == '-') c = '+';  // the URL-safe alphabet
    if (c == '_') c = '/';
  }
  auto bytes = kj::decodeBase64(text);
  KJ_REQUIRE(!bytes.hadErrors, "not base64");
  return orphanage.newOrphanCopy(capnp::Data::Reader(bytes));
}

CallJson::CallJson() {
  codec.setRejectUnknownFields(true);
  codec.addTypeHandler(base64);
}

void CallJson::decodeParams(kj::StringPtr json, capnp::DynamicStruct::Builder params,
                            kj::StringPtr method) const {
  KJ_IF_MAYBE(error, jsonSyntaxError(json)) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("'", printable(json), "' is not valid JSON: ", *error));
  }
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<capnp::JsonValue>();
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { codec.decodeRaw(json, root); })) {
    // Valid by the grammar, yet refused (nested too deeply, say).
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("'", printable(json), "' cannot be read: ", e->getDescription()));
  }
  auto value = root.asReader();
  auto schema = params.getSchema();
  if (!value.isObject()) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str(method, " takes a JSON object of its parameters (", fieldNames(schema),
                       "), not '", printable(json), "'"));
  }
  for (auto member : value.getObject()) {
    KJ_IF_MAYBE(field, schema.findFieldByName(member.getName())) {
      decodeParam(*field, member.getValue(), params, method);
    } else {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str(method, " has no parameter '", printable(member.getName()), "' (it has ",
                         fieldNames(schema), ")"));
    }
  }
}

void CallJson::decodeParam(capnp::StructSchema::Field field, capnp::JsonValue::Reader value,
                           capnp::DynamicStruct::Builder params, kj::StringPtr method) const {
  auto name = field.getProto().getName();
  auto type = field.getType();
  if (type.isInterface() || type.isAnyPointer()) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("parameter '", name, "' of ", method, " is ", describeType(type),
                       ", which cannot be given as JSON"));
  }
  auto failed = kj::runCatchingExceptions([&]() {
    if (field.getProto().isGroup()) {
      codec.decode(value, params.init(field).as<capnp::DynamicStruct>());
    } else {
      params.adopt(field,
                   codec.decode(value, type, capnp::Orphanage::getForMessageContaining(params)));
    }
  });
  if (failed != nullptr) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("parameter '", name, "' of ", method, " is ", describeType(type), "; got ",
                       printable(codec.encodeRaw(value))));
  }
}

kj::String CallJson::encodeResults(capnp::DynamicStruct::Reader results) const {
  return codec.encode(kj::mv(results));
}

kj::Maybe<kj::String> jsonSyntaxError(kj::ArrayPtr<const char> text) {
  return SyntaxCheck(text).run();
}

kj::String describeType(capnp::Type type) {
  if (type.isText()) return kj::str("Text, a string");
  if (type.isData()) return kj::str("Data, a base64 string");
  auto name = capnpTypeName(type);
  // "an Int64", but "a UInt64": the article goes by the sound.
  bool vowel = !name.empty() && kj::StringPtr("AEIO").findFirst(name[0]) != nullptr;
  return kj::str(vowel ? "an " : "a ", name.c_str());
}

}  // namespace troupe::cli
