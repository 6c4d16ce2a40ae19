#include "tools/troupe/call_json.h"

#include <math.h>

#include <type_traits>

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

// 2^53: up to this magnitude a double holds every whole number exactly.
constexpr double EXACT_IN_DOUBLE = 9007199254740992.0;

// Adds to `missing` the parameters of `schema` that the JSON object `object` leaves out: "'b'",
// a group's field as "'at.row'" (`prefix` is "at."), and for a union none of whose fields is
// given "one of 'shape'/'color'". Fields of a group given as an object are looked for in it.
void findMissing(capnp::JsonValue::Reader object, capnp::StructSchema schema, kj::StringPtr prefix,
                 kj::Vector<kj::String>& missing) {
  auto given = [&](capnp::StructSchema::Field field) -> kj::Maybe<capnp::JsonValue::Reader> {
    for (auto member : object.getObject()) {
      if (member.getName() == field.getProto().getName()) return member.getValue();
    }
    return nullptr;
  };
  auto lookInto = [&](capnp::StructSchema::Field field, capnp::JsonValue::Reader value) {
    if (field.getProto().isGroup() && value.isObject()) {
      findMissing(value, field.getType().asStruct(),
                  kj::str(prefix, field.getProto().getName(), "."), missing);
    }
  };
  for (auto field : schema.getNonUnionFields()) {
    KJ_IF_MAYBE(value, given(field)) {
      lookInto(field, *value);
    } else {
      missing.add(kj::str("'", prefix, field.getProto().getName(), "'"));
    }
  }
  auto unionFields = schema.getUnionFields();
  if (unionFields.size() == 0) return;
  for (auto field : unionFields) {
    KJ_IF_MAYBE(value, given(field)) {
      lookInto(field, *value);
      return;
    }
  }
  kj::Vector<kj::String> names;
  for (auto field : unionFields) names.add(kj::str("'", prefix, field.getProto().getName(), "'"));
  missing.add(kj::str("one of ", kj::strArray(names, "/")));
}

// `text` as a JSON string, escaped as Cap'n Proto's JsonCodec escapes it.
void writeString(kj::StringPtr text, kj::Vector<char>& out) {
  static constexpr char HEX[] = "0123456789abcdef";
  out.add('"');
  for (char c : text) {
    switch (c) {
      case '"':
        out.addAll(kj::StringPtr("\\\""));
        break;
      case '\\':
        out.addAll(kj::StringPtr("\\\\"));
        break;
      case '\b':
        out.addAll(kj::StringPtr("\\b"));
        break;
      case '\f':
        out.addAll(kj::StringPtr("\\f"));
        break;
      case '\n':
        out.addAll(kj::StringPtr("\\n"));
        break;
      case '\r':
        out.addAll(kj::StringPtr("\\r"));
        break;
      case '\t':
        out.addAll(kj::StringPtr("\\t"));
        break;
      default: {
        auto byte = static_cast<unsigned char>(c);
        if (byte < 0x20) {
          out.addAll(kj::StringPtr("\\u00"));
          out.add(HEX[byte / 16]);
          out.add(HEX[byte % 16]);
        } else {
          out.add(c);
        }
      }
    }
  }
  out.add('"');
}

// `value` as compact JSON, as JsonCodec::encodeRaw() writes it, except that a whole number of
// magnitude up to 2^53 is written in digits ("1000000000000000", where kj writes "1e15").
void writeJson(const capnp::JsonCodec& codec, capnp::JsonValue::Reader value,
               kj::Vector<char>& out) {
  switch (value.which()) {
    case capnp::JsonValue::NUMBER: {
      double number = value.getNumber();
      if (number != 0 && fabs(number) <= EXACT_IN_DOUBLE && number == trunc(number)) {
        out.addAll(kj::str(static_cast<int64_t>(number)));
      } else {
        out.addAll(kj::str(number));
      }
      break;
    }
    case capnp::JsonValue::STRING:
      writeString(value.getString(), out);
      break;
    case capnp::JsonValue::ARRAY: {
      out.add('[');
      bool first = true;
      for (auto element : value.getArray()) {
        if (!first) out.add(',');
        first = false;
        writeJson(codec, element, out);
      }
      out.add(']');
      break;
    }
    case capnp::JsonValue::OBJECT: {
      out.add('{');
      bool first = true;
      for (auto member : value.getObject()) {
        if (!first) out.add(',');
        first = false;
        writeString(member.getName(), out);
        out.add(':');
        writeJson(codec, member.getValue(), out);
      }
      out.add('}');
      break;
    }
    default:  // null, true, false (and calls, which results never hold)
      out.addAll(codec.encodeRaw(value));
  }
}

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

template <typename T>
void Int64Handler<T>::encode(const capnp::JsonCodec&, T input,
                             capnp::JsonValue::Builder output) const {
  auto magnitude = static_cast<uint64_t>(input);
  if constexpr (std::is_signed_v<T>) {
    if (input < 0) magnitude = -magnitude;  // -2^63 too: unsigned negation wraps to 2^63
  }
  if (magnitude <= static_cast<uint64_t>(EXACT_IN_DOUBLE)) {
    output.setNumber(static_cast<double>(input));
  } else {
    output.setString(kj::str(input));
  }
}

template <typename T>
T Int64Handler<T>::decode(const capnp::JsonCodec&, capnp::JsonValue::Reader input) const {
  switch (input.which()) {
    case capnp::JsonValue::NUMBER: {
      double number = input.getNumber();
      KJ_REQUIRE(number == trunc(number), "not a whole number");
      KJ_REQUIRE(std::is_signed_v<T> || number >= 0, "negative");
      // 2^53 itself reads back as encode() writes it, though "2^53 + 1" reads as 2^53 too.
      if (fabs(number) > EXACT_IN_DOUBLE) {
        throwError(ErrorCode::INVALID_ARGUMENT,
                   "a JSON number of magnitude beyond 2^53 may have lost digits: give it as a "
                   "string of digits instead");
      }
      return static_cast<T>(number);
    }
    case capnp::JsonValue::STRING:
      return input.getString().parseAs<T>();
    default:
      KJ_FAIL_REQUIRE("not an integer");
  }
}

template class Int64Handler<int64_t>;
template class Int64Handler<uint64_t>;

CallJson::CallJson() {
  codec.setRejectUnknownFields(true);
  codec.addTypeHandler(base64);
  codec.addTypeHandler(int64);
  codec.addTypeHandler(uint64);
}

void CallJson::decodeParams(kj::StringPtr json, capnp::DynamicStruct::Builder params,
                            kj::StringPtr method, MissingParams missing) const {
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
  if (missing == MissingParams::DEFAULT) return;
  kj::Vector<kj::String> left;
  findMissing(value, schema, "", left);
  if (left.size() == 1) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str(method, " is missing parameter ", left[0],
                       ": give it, or say --partial to let it take its default"));
  }
  if (left.size() > 1) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str(method, " is missing parameters ", kj::strArray(left, ", "),
                       ": give them, or say --partial to let them take their defaults"));
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
  KJ_IF_MAYBE(e, failed) {
    // A reason of troupe's own (from Int64Handler) says what to write instead; kj's would not.
    auto reason = errorCode(*e) == ErrorCode::INVALID_ARGUMENT ? kj::str(": ", errorMessage(*e))
                                                               : kj::str();
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("parameter '", name, "' of ", method, " is ", describeType(type), "; got ",
                       printable(codec.encodeRaw(value)), reason));
  }
}

kj::String CallJson::encodeResults(capnp::DynamicStruct::Reader results) const {
  capnp::MallocMessageBuilder message;
  auto json = message.initRoot<capnp::JsonValue>();
  codec.encode(results, results.getSchema(), json);
  kj::Vector<char> out;
  writeJson(codec, json.asReader(), out);
  out.add('\0');
  return kj::String(out.releaseAsArray());
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
