#pragma once
// How `troupe call` reads a method's parameters from JSON and writes its results as JSON:
// Cap'n Proto's JsonCodec, with Data as base64 strings (as protobuf's JSON mapping and grpcurl
// have it), and errors in the caller's terms that name the parameter at fault.

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

// The JSON codec of `troupe call`. Holds no state between calls; not thread-safe to configure,
// safe to use from one thread.
class CallJson {
public:
  CallJson();
  KJ_DISALLOW_COPY(CallJson);

  // Fills `params` from the JSON object `json`, each field the parameter of that name; parameters
  // it does not name keep their defaults. `method` names the method in messages ("calc.add").
  // Throws INVALID_ARGUMENT saying what is wrong: the text is not JSON (and where), not an
  // object, names a parameter the method does not have (listing those it has), or gives a
  // parameter a value that does not fit its type (naming the parameter, its type and the value).
  void decodeParams(kj::StringPtr json, capnp::DynamicStruct::Builder params,
                    kj::StringPtr method) const;

  // `results` as one line of JSON.
  kj::String encodeResults(capnp::DynamicStruct::Reader results) const;

private:
  void decodeParam(capnp::StructSchema::Field field, capnp::JsonValue::Reader value,
                   capnp::DynamicStruct::Builder params, kj::StringPtr method) const;

  Base64DataHandler base64;  // before `codec`, which borrows it
  capnp::JsonCodec codec;
};

// Where `text` breaks JSON's grammar (RFC 8259), for people: "it ends where a value should be",
// "'x' at byte 7 (counting from 1) where a value should be"; null when it is one valid JSON value.
kj::Maybe<kj::String> jsonSyntaxError(kj::ArrayPtr<const char> text);

// "a Float64", "an Int64", "a List(Float64)", "Text, a string", "Data, a base64 string": a
// Cap'n Proto type as a parameter's type reads in a sentence.
kj::String describeType(capnp::Type type);

}  // namespace troupe::cli
