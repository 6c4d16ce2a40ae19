#pragma once
// How `troupe call` reads a method's parameters from JSON and writes its results as JSON:
// Cap'n Proto's JsonCodec, with Data as base64 strings (as protobuf's JSON mapping and grpcurl
// have it), 64-bit integers as numbers where a double holds them exactly (strings beyond), and
// errors in the caller's terms that name the parameter at fault.

#include <capnp/compat/json.h>
#include <capnp/dynamic.h>
#include <kj/string.h>

namespace troupe::cli {

// Data as a base64 string: encodes with padding; decodes the standard and the URL-safe alphabet,
// padding optional. Stateless; used by CallJson's codec.
class Base64DataHandler final : public capnp::JsonCodec::Handler<capnp::Data> {
public:
  void encode(const capnp::JsonCodec& codec, capnp::Data::Reader input,
              capnp::JsonValue::Builder output) const override;
  capnp::Orphan<capnp::Data> decode(const capnp::JsonCodec& codec, capnp::JsonValue::Reader input,
                                    capnp::Orphanage orphanage) const override;
};

// Int64 (T = int64_t) or UInt64 (uint64_t) as JSON: a number when its magnitude is at most 2^53,
// where a double holds every whole number exactly, and a string of its digits beyond, where a
// JSON reader would round it. Decodes a whole number of magnitude at most 2^53, or a string of
// digits; refuses a larger number (it may have lost digits already), saying to write it as a
// string. Stateless; used by CallJson's codec.
template <typename T>
class Int64Handler final : public capnp::JsonCodec::Handler<T> {
public:
  void encode(const capnp::JsonCodec& codec, T input,
              capnp::JsonValue::Builder output) const override;
  T decode(const capnp::JsonCodec& codec, capnp::JsonValue::Reader input) const override;
};

// What CallJson::decodeParams does with the parameters a JSON object leaves out.
enum class MissingParams {
  REFUSE,   // INVALID_ARGUMENT naming them: a call says every parameter (troupe call)
  DEFAULT,  // each keeps its default (troupe call --partial)
};

// The JSON codec of `troupe call`. Holds no state between calls; not thread-safe to configure,
// safe to use from one thread.
class CallJson {
public:
  CallJson();
  KJ_DISALLOW_COPY(CallJson);

  // Fills `params` from the JSON object `json`, each field the parameter of that name; parameters
  // it does not name keep their defaults with MissingParams::DEFAULT. `method` names the method
  // in messages ("calc.add"). Throws INVALID_ARGUMENT saying what is wrong: the text is not JSON
  // (and where), not an object, names a parameter the method does not have (listing those it
  // has), gives a parameter a value that does not fit its type (naming the parameter, its type
  // and the value), or, with MissingParams::REFUSE, leaves out parameters (naming them, those of
  // groups as "group.field", a union's as "one of 'a'/'b'", and saying --partial).
  void decodeParams(kj::StringPtr json, capnp::DynamicStruct::Builder params, kj::StringPtr method,
                    MissingParams missing) const;

  // `results` as one line of JSON (whole numbers up to 2^53 in digits, never as "1e15").
  kj::String encodeResults(capnp::DynamicStruct::Reader results) const;

private:
  void decodeParam(capnp::StructSchema::Field field, capnp::JsonValue::Reader value,
                   capnp::DynamicStruct::Builder params, kj::StringPtr method) const;

  Base64DataHandler base64;  // these before `codec`, which borrows them
  Int64Handler<int64_t> int64;
  Int64Handler<uint64_t> uint64;
  capnp::JsonCodec codec;
};

// Where `text` breaks JSON's grammar (RFC 8259), for people: "it ends where a value should be",
// "'x' at byte 7 (counting from 1) where a value should be"; null when it is one valid JSON value.
kj::Maybe<kj::String> jsonSyntaxError(kj::ArrayPtr<const char> text);

// "a Float64", "an Int64", "a List(Float64)", "Text, a string", "Data, a base64 string": a
// Cap'n Proto type as a parameter's type reads in a sentence.
kj::String describeType(capnp::Type type);

}  // namespace troupe::cli
