#pragma once
// parsePrometheusText: the Prometheus text exposition format (version 0.0.4) read back into a
// MetricsSnapshot, for clients of /metrics (`troupe top`, the registry's history) and for tests.
//
// What MetricsSnapshot::toPrometheusText() writes reads back into an equal snapshot: the same
// families, help, types, series (in the same order, labels in the same order), values and
// histograms. Text from other exporters reads too, within what a MetricsSnapshot can hold:
//
//   # HELP / # TYPE   kept; HELP text is unescaped (\\ and \n). Other lines starting with '#'
//                     are comments and skipped, as are empty lines. Lines end in "\n" (or
//                     "\r\n"); the last may end without one.
//   counter, gauge    one series per sample line; an optional timestamp is read and dropped.
//   untyped, and samples with no TYPE line
//                     gauges.
//   summary           its series kept as gauges under their own names (X{quantile=...}, X_sum,
//                     X_count), with the summary's help.
//   histogram         reassembled from X_bucket{le=...} (cumulative), X_sum (seconds) and
//                     X_count into a LatencyHistogram (per-bucket counts). Bounds other than
//                     troupe's fixed LATENCY_BUCKET_BOUNDS_NS are not refused: each bucket is put
//                     in the troupe bucket with the nearest bound at or above its own (a bound
//                     past 60 s in +Inf), so quantiles read from it are never below the
//                     exporter's. The bounds are read as seconds, whatever the histogram counts.
//                     Without a +Inf bucket the count is X_count (or the largest bucket); the
//                     counts must be whole numbers that do not decrease as le grows, and X_count
//                     must equal the +Inf bucket when both are given.
//
// Label values are unescaped (\\, \" and \n), and may hold any bytes. A series given twice, a
// second HELP or TYPE line for a name, a TYPE line after the name's samples, and a histogram
// whose name's _bucket, _sum or _count is already a family of its own are malformed.
//
// The text comes from the network, so what is kept is bounded (PrometheusTextLimits), and
// nothing in it makes the parser crash, or take more than time linear in its size and the
// snapshot's series. Malformed text is refused whole with INVALID_ARGUMENT (errors.h): "metrics
// text line N: <what is wrong>: '<the line, printable() and cut short>'", where what is wrong
// with a histogram as a whole (its buckets and count disagree) names the line its series starts.

#include <cstddef>

#include <kj/string.h>

#include "troupe/base/metrics.h"

namespace troupe {

// What parsePrometheusText keeps at most; past any of them the whole text is refused with
// INVALID_ARGUMENT naming the limit.
struct PrometheusTextLimits {
  // Bytes of text. Default 16 MiB.
  size_t maxBytes = 16 * 1024 * 1024;
  // Series in all families together (a histogram's series is one, however many lines it takes),
  // and names given a HELP or TYPE line. Default 100,000.
  size_t maxSeries = 100'000;
  // Series in one family. Default 2,000. A MetricsSnapshot finds a series by comparing it with
  // each of its family's in turn, so filling a family of n series takes time in n^2: this keeps
  // the worst text within the default limits to about a second.
  size_t maxSeriesPerFamily = 2'000;
  // Labels on one series. Default 64.
  size_t maxLabels = 64;
  // Bucket lines of one histogram series. Default 1,000.
  size_t maxBuckets = 1'000;
};

// The snapshot `text` describes. Pure: no loop, no I/O; any thread. Throws INVALID_ARGUMENT
// (with the line number and the line, made printable) for malformed text, and for text past
// `limits`.
MetricsSnapshot parsePrometheusText(kj::StringPtr text, const PrometheusTextLimits& limits = {});

}  // namespace troupe
