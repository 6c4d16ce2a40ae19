@0xf1c7261c02bb98fb;
# Parameters of every kind `troupe call` reads from JSON, for fuzz/call_json_fuzz.cpp.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::fuzz");

enum Color {
  red @0;
  green @1;
  blue @2;
}

struct Point {
  x @0 :Float64;
  y @1 :Float64;
  label @2 :Text;
}

struct Shape {
  union {
    circle @0 :Float64;
    square @1 :Point;
    none @2 :Void;
  }
  tags @3 :List(Text);
}

# A method's parameters given as a struct of their own may hold groups and unions.
struct Placement {
  at :group {
    row @0 :UInt32;
    column @1 :UInt32;
  }
  union {
    shape @2 :Shape;
    color @3 :Color;
    nothing @4 :Void;
  }
  weight @5 :Float32 = 1.5;
}

interface CallParams {
  scalars @0 (b :Bool, i8 :Int8, i16 :Int16, i32 :Int32, i64 :Int64, u8 :UInt8, u16 :UInt16,
              u32 :UInt32, u64 :UInt64, f32 :Float32, f64 :Float64) -> ();
  texts @1 (text :Text, data :Data, color :Color, nothing :Void) -> ();
  lists @2 (ints :List(Int64), floats :List(Float32), bools :List(Bool), texts :List(Text),
            blobs :List(Data), points :List(Point), nested :List(List(UInt8)),
            colors :List(Color), voids :List(Void)) -> ();
  structs @3 (point :Point, shape :Shape, shapes :List(Shape)) -> ();
  place @4 Placement -> ();
  defaults @5 (n :Int32 = 42, s :Text = "forty-two", p :Point = (x = 1, y = 2)) -> ();
  none @6 () -> ();
  # Not expressible in JSON: refused with a message.
  capability @7 (peer :CallParams) -> ();
  anything @8 (value :AnyPointer) -> ();
}

# Methods are found through superclasses too.
interface MoreCallParams extends(CallParams) {
  more @0 (x :Int64) -> (x :Int64);
}
