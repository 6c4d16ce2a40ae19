#!/usr/bin/env bash
# Checks troupe's layering and function length; CI runs it from the repository root.
#
#   scripts/check_layers.sh [ROOT]          ROOT defaults to the repository this script is in
#   scripts/check_layers.sh --longest 15    also lists the 15 longest functions
#
# Prints "FILE:LINE: message" for each violation and exits 1, or prints one summary line and
# exits 0. Needs python3 only (the logic is in scripts/check_layers.py, standard library).
#
# 1. Layer direction. LAYERS below runs from the bottom up; each top-level folder is one layer
#    (a missing folder is simply absent). A file in a layer's folder may include troupe code
#    ("troupe/<layer>/..." or <troupe/<layer>/...>, or "tools/..." and "python/..." for the two
#    top layers, which are independent of each other) only of its own layer or a lower one.
#    troupe/version.h may be included anywhere; the umbrella troupe/troupe.h only by the top
#    layers and by tests, benchmarks, fuzz targets and examples. Library code must not include
#    tests/, bench/, fuzz/ or examples/; nothing may include troupe code by its source path
#    ("actor/x.h", "detail/x.h") instead of its installed one ("troupe/actor/x.h").
# 2. detail/ boundaries. "troupe/<layer>/detail/..." may be included only from <layer>/ itself
#    and from tests/<layer>/ (a layer's tests test its internals). Anything else, such as
#    tests/support/, bench/, fuzz/ or examples/, needs an entry in DETAIL_INCLUDE_ALLOWLIST.
# 3. Function length. In library code (LIBRARY below; not tests, bench, fuzz or examples) no
#    function body may run over MAX_FUNCTION_LINES lines, counted from the line of its opening
#    brace to the line of its closing brace; lambdas and local classes count as part of the
#    function that holds them. Functions are found by matching braces in the source with
#    comments, literals and preprocessor lines blanked, descending into namespaces, classes and
#    extern "C" blocks (so a class's inline methods are measured), never into function bodies.
#
# Adding an exception: add a line to the block concerned below, with a "# reason" (required).
#   DETAIL_INCLUDE_ALLOWLIST     FILE-OR-GLOB  troupe/LAYER/detail/HEADER  # reason
#   FUNCTION_LENGTH_EXCEPTIONS   PATH::Function::Name  # reason
# PATH and FILE are relative to the repository root; Function::Name is the name as the script
# reports it (Class::method, also for methods defined inside their class; overloads share one
# entry). Entries that no longer match anything are reported as notes, to be removed.
set -euo pipefail

LAYERS='schemas base net observe actor resolver pool jobs tools,python'  # bottom up; a,b: peers
LIBRARY='base net observe actor resolver pool jobs tools python'
MAX_FUNCTION_LINES=80

: <<'DETAIL_INCLUDE_ALLOWLIST'
fuzz/frame_reader_fuzz.cpp  troupe/net/detail/message_stream.h  # fuzzes the frame reader itself, below any public API
bench/history_bench.cpp  troupe/resolver/detail/metrics_history.h  # measures the registry's history itself, which has no public API
bench/memory_bench.cpp  troupe/actor/detail/reply_cache.h  # measures the memory per kept reply, which has no public API
bench/blob_bench.cpp  troupe/actor/detail/blob_fanout.h  # measures the receiver's check-and-copy of a chunk itself, below any public API
DETAIL_INCLUDE_ALLOWLIST

: <<'FUNCTION_LENGTH_EXCEPTIONS'
FUNCTION_LENGTH_EXCEPTIONS

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --longest) extra+=(--longest "$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) root=$(cd "$1" 2>/dev/null && pwd) || { echo "check_layers: no folder $1" >&2; exit 2; }
       shift ;;
  esac
done

exec /usr/bin/python3 "$here/check_layers.py" --root "$root" --config "$here/check_layers.sh" \
  --layers "$LAYERS" --library "$LIBRARY" --max-lines "$MAX_FUNCTION_LINES" "${extra[@]}"
