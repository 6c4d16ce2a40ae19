// An ActorServer's metrics: what server.metrics() and its HTTP endpoint say after known traffic.

#include "troupe/base/metrics.h"

#include <cstdio>
#include <fstream>

#include <capnp/compat/json.h>
#include <gtest/gtest.h>
#include <kj/debug.h>

#include "tests/support/calculator_calls.h"
#include "tests/support/http_get.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/server_fixture.h"

namespace troupe::test {
namespace {

MetricLabels callLabels(const char* actor, const char* method) {
  return {{"job", "job-1"}, {"actor", actor}, {"method", method}};
}

MetricLabels withCode(MetricLabels labels, const char* code) {
  labels.emplace_back("code", code);
  return labels;
}

using MetricsTest = ServerFixture;

TEST_F(MetricsTest, ThreeCallsAndOneErrorAreCountedExactly) {
  auto calc = ref<Calculator>("calc");
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  EXPECT_EQ(await(loop, add(calc, 3, 4)), 7);
  EXPECT_EQ(awaitError(loop, divide(calc, 1, 0)).code, ErrorCode::FAILED);

  auto m = server->metrics();
  EXPECT_EQ(m.value("troupe_calls_started_total", callLabels("calc", "add")), 2);
  EXPECT_EQ(m.value("troupe_calls_started_total", callLabels("calc", "divide")), 1);
  EXPECT_EQ(m.value("troupe_calls_total", withCode(callLabels("calc", "add"), "ok")), 2);
  EXPECT_EQ(m.value("troupe_calls_total", withCode(callLabels("calc", "divide"), "ok")), 0);
  EXPECT_EQ(m.value("troupe_calls_total", withCode(callLabels("calc", "divide"), "failed")), 1);
  EXPECT_EQ(m.sum("troupe_calls_total", {{"actor", "calc"}}), 3);
  EXPECT_EQ(m.sum("troupe_calls_total", {{"code", "failed"}}), 1);
  EXPECT_EQ(m.value("troupe_calls_in_flight", callLabels("calc", "add")), 0);
  EXPECT_EQ(m.histogram("troupe_call_duration_seconds", callLabels("calc", "add")).count, 2u);
  EXPECT_EQ(m.histogram("troupe_call_duration_seconds", callLabels("calc", "divide")).count, 1u);
  // The methods of the interface it extends are its own too; none of them ran.
  EXPECT_EQ(m.value("troupe_calls_started_total", callLabels("calc", "sqrt")), 0);
  ASSERT_NE(m.family("troupe_calls_started_total")->find(callLabels("calc", "sqrt")), nullptr);
  // Other actors were not called.
  EXPECT_EQ(m.sum("troupe_calls_started_total", {{"actor", "echo"}}), 0);
  // The calls' messages crossed one connection.
  MetricLabels transport = {{"job", "job-1"}, {"server", "actor"}};
  EXPECT_EQ(m.value("troupe_connections_accepted_total", transport), 1);
  EXPECT_EQ(m.value("troupe_connections_open", transport), 1);
  EXPECT_GE(m.value("troupe_messages_received_total", transport), 3);
  EXPECT_GT(m.value("troupe_received_bytes_total", transport), 0);
  EXPECT_EQ(m.value("troupe_large_messages_received_total", transport), 0);
}

TEST_F(MetricsTest, CallsInFlightQueuedAndCancelledAreSeen) {
  auto serialRef = ref<Blocker>("serial");
  auto first = hold(serialRef, "first");
  auto second = hold(serialRef, "second");
  ASSERT_TRUE(pollUntil([&]() { return serial.started == 1 && server->callsInFlight() == 2; }));

  auto m = server->metrics();
  EXPECT_EQ(m.value("troupe_calls_in_flight", callLabels("serial", "hold")), 2);
  EXPECT_EQ(m.value("troupe_actor_queue_depth", {{"job", "job-1"}, {"actor", "serial"}}), 1);

  // The second call's caller gives up while it waits: cancelled, and never ran.
  second = nullptr;
  ASSERT_TRUE(pollUntil([&]() { return server->callsInFlight() == 1; }));
  EXPECT_TRUE(serial.release("first"));
  await(loop, kj::mv(first));

  m = server->metrics();
  EXPECT_EQ(m.value("troupe_calls_in_flight", callLabels("serial", "hold")), 0);
  EXPECT_EQ(m.value("troupe_actor_queue_depth", {{"job", "job-1"}, {"actor", "serial"}}), 0);
  EXPECT_EQ(m.value("troupe_calls_total", withCode(callLabels("serial", "hold"), "ok")), 1);
  EXPECT_EQ(m.value("troupe_calls_total", withCode(callLabels("serial", "hold"), "cancelled")), 1);
  // Only the call that ran waited for, and got, a place.
  EXPECT_EQ(
      m.histogram("troupe_actor_queue_wait_seconds", {{"job", "job-1"}, {"actor", "serial"}}).count,
      1u);
}

TEST_F(MetricsTest, CallsRefusedWhileDrainingCountWithTheirCode) {
  auto calc = ref<Calculator>("calc");
  EXPECT_EQ(await(loop, add(calc, 1, 1)), 2);
  auto b = ref<Blocker>("blocker");
  auto held = hold(b, "keep");  // keeps the drain from finishing
  ASSERT_TRUE(pollUntil([&]() { return blocker.started == 1; }));
  auto drained = server->drain();
  EXPECT_EQ(awaitError(loop, add(calc, 2, 2)).code, ErrorCode::DRAINING);

  auto m = server->metrics();
  EXPECT_EQ(m.value("troupe_calls_started_total", callLabels("calc", "add")), 2);
  EXPECT_EQ(m.value("troupe_calls_total", withCode(callLabels("calc", "add"), "draining")), 1);
  EXPECT_EQ(m.value("troupe_calls_total", withCode(callLabels("calc", "add"), "ok")), 1);
  blocker.release("keep");
  await(loop, kj::mv(drained));
}

TEST_F(MetricsTest, LargeMessagesAreCountedApart) {
  auto echo = ref<Echo>("echo");
  auto payload = kj::heapArray<kj::byte>(100 * 1024);
  memset(payload.begin(), 'x', payload.size());
  auto r = await(loop, echo.call([&](Echo::Client c) {
    auto q = c.echoRequest();
    q.setPayload(payload);
    return q.send();
  }));
  EXPECT_EQ(r.getPayload().size(), payload.size());
  auto m = server->metrics();
  MetricLabels transport = {{"job", "job-1"}, {"server", "actor"}};
  EXPECT_EQ(m.value("troupe_large_messages_received_total", transport), 1);
  EXPECT_EQ(m.value("troupe_large_messages_sent_total", transport), 1);
  EXPECT_GT(m.value("troupe_sent_bytes_total", transport), 100 * 1024);

  // The client's side of the same connection.
  auto client = loop.metrics().collect();
  MetricLabels peer = {{"peer", address}};
  EXPECT_EQ(client.value("troupe_client_connections_total", peer), 1);
  EXPECT_EQ(client.value("troupe_client_connected", peer), 1);
  EXPECT_EQ(client.value("troupe_client_large_messages_sent_total", peer), 1);
  EXPECT_EQ(client.value("troupe_client_large_messages_received_total", peer), 1);
  EXPECT_GT(client.value("troupe_client_sent_bytes_total", peer), 100 * 1024);
}

TEST_F(MetricsTest, CallsThroughAnActorRefAreCountedByOutcomeOnTheCallersSide) {
  auto calc = ref<Calculator>("calc");
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  EXPECT_EQ(await(loop, add(calc, 3, 4)), 7);
  EXPECT_EQ(awaitError(loop, divide(calc, 1, 0)).code, ErrorCode::FAILED);
  await(loop, calc.ping());  // asks the host, not the actor: not counted
  auto b = ref<Blocker>("blocker");
  EXPECT_EQ(awaitError(loop, hold(b, "late", {.deadline = 1 * kj::MILLISECONDS})).code,
            ErrorCode::DEADLINE_EXCEEDED);
  auto dropped = hold(b, "dropped");
  EXPECT_EQ(b.metrics().value("troupe_ref_calls_in_flight",
                              {{"peer", address}, {"actor", "blocker"}}),
            1);
  dropped = nullptr;

  MetricLabels labels = {{"peer", address}, {"actor", "calc"}};
  auto m = calc.metrics();
  EXPECT_EQ(m.value("troupe_ref_calls_total", withCode(labels, "ok")), 2);
  EXPECT_EQ(m.value("troupe_ref_calls_total", withCode(labels, "failed")), 1);
  EXPECT_EQ(m.sum("troupe_ref_calls_total"), 3);
  EXPECT_EQ(m.value("troupe_ref_calls_in_flight", labels), 0);
  EXPECT_EQ(m.histogram("troupe_ref_call_duration_seconds", labels).count, 3u);
  // A copy shares the counts; the loop's metrics hold every handle's.
  auto copy = calc;
  EXPECT_EQ(copy.metrics().sum("troupe_ref_calls_total"), 3);
  auto all = loop.metrics().collect();
  MetricLabels blockerLabels = {{"peer", address}, {"actor", "blocker"}};
  EXPECT_EQ(all.value("troupe_ref_calls_total", withCode(blockerLabels, "deadline_exceeded")), 1);
  EXPECT_EQ(all.value("troupe_ref_calls_total", withCode(blockerLabels, "cancelled")), 1);
  EXPECT_EQ(all.value("troupe_ref_calls_in_flight", blockerLabels), 0);
  EXPECT_EQ(all.sum("troupe_ref_calls_total", {{"actor", "calc"}}), 3);
}

TEST_F(MetricsTest, AnActorRefCanBeToldToCountNothing) {
  auto calc = ActorRef<Calculator>::connect(loop, address.c_str(), "calc", {.metrics = false});
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  EXPECT_EQ(calc.metrics().families().size(), 0u);
  EXPECT_EQ(loop.metrics().collect().family("troupe_ref_calls_total"), nullptr);
}

// ---------------------------------------------------------------------------------------------
// Latency, on the loop's clock.

class ManualClockMetricsTest : public ServerFixture {
protected:
  ManualClockMetricsTest() : ServerFixture({.manualClock = true}) {}
};

TEST_F(ManualClockMetricsTest, LatencyLandsInTheBucketOfTheTimeTheCallTook) {
  auto b = ref<Blocker>("serial");
  auto first = hold(b, "a");
  ASSERT_TRUE(pollUntil([&]() { return serial.started == 1; }));
  auto second = hold(b, "b");
  ASSERT_TRUE(pollUntil([&]() { return server->callsInFlight() == 2; }));
  loop.advanceTime(30 * kj::MILLISECONDS);
  serial.release("a");
  await(loop, kj::mv(first));
  ASSERT_TRUE(pollUntil([&]() { return serial.started == 2; }));
  loop.advanceTime(2 * kj::SECONDS);
  serial.release("b");
  await(loop, kj::mv(second));

  auto m = server->metrics();
  auto latency = m.histogram("troupe_call_duration_seconds", callLabels("serial", "hold"));
  ASSERT_EQ(latency.count, 2u);
  // 30 ms lies in (25 ms, 50 ms]; 2.03 s in (1 s, 2.5 s].
  EXPECT_EQ(latency.counts[12], 1u);
  EXPECT_EQ(latency.counts[17], 1u);
  EXPECT_EQ(latency.sumNanos, (30 + 2030) * 1'000'000);
  EXPECT_NEAR(latency.quantileSeconds(0.5), 0.050, 1e-9);
  // The second call waited 30 ms for the first to finish.
  auto wait = m.histogram("troupe_actor_queue_wait_seconds",
                          {{"job", "job-1"}, {"actor", "serial"}});
  ASSERT_EQ(wait.count, 2u);
  EXPECT_EQ(wait.sumNanos, 30 * 1'000'000);
  // The caller saw both calls from the start: 30 ms and 2.03 s.
  auto seen = b.metrics().histogram("troupe_ref_call_duration_seconds",
                                    {{"peer", address}, {"actor", "serial"}});
  ASSERT_EQ(seen.count, 2u);
  EXPECT_EQ(seen.counts[12], 1u);
  EXPECT_EQ(seen.counts[17], 1u);
  EXPECT_EQ(seen.sumNanos, (30 + 2030) * 1'000'000);
}

// ---------------------------------------------------------------------------------------------
// The snapshot itself.

TEST(MetricsSnapshotTest, SeriesWithTheSameLabelsSumAndOthersStayApart) {
  MetricsSnapshot a;
  a.add("troupe_x_total", "x", MetricType::COUNTER, {{"actor", "p"}, {"job", "j"}}, 2);
  a.add("troupe_x_total", "x", MetricType::COUNTER, {{"job", "j"}, {"actor", "p"}}, 3);
  a.add("troupe_x_total", "x", MetricType::COUNTER, {{"job", "j"}, {"actor", "q"}}, 1);
  MetricsSnapshot b;
  b.add("troupe_x_total", "x", MetricType::COUNTER, {{"job", "j"}, {"actor", "q"}}, 10);
  LatencyHistogram h;
  h.record(3 * kj::MICROSECONDS);
  h.record(70 * kj::SECONDS);
  b.addHistogram("troupe_y_seconds", "y", {}, h);
  a.merge(b);
  EXPECT_EQ(a.value("troupe_x_total", {{"actor", "p"}, {"job", "j"}}), 5);
  EXPECT_EQ(a.value("troupe_x_total", {{"actor", "q"}, {"job", "j"}}), 11);
  EXPECT_EQ(a.sum("troupe_x_total"), 16);
  EXPECT_EQ(a.family("troupe_x_total")->samples.size(), 2u);
  auto y = a.histogram("troupe_y_seconds");
  EXPECT_EQ(y.counts.front(), 1u);
  EXPECT_EQ(y.counts.back(), 1u);
  EXPECT_EQ(y.quantileSeconds(1.0), 60.0);
  auto text = a.toPrometheusText();
  EXPECT_NE(text.find("troupe_y_seconds_bucket{le=\"5e-06\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe_y_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe_y_seconds_count 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE troupe_x_total counter\n"), std::string::npos) << text;
}

TEST(MetricsSnapshotTest, LabelValuesAreEscapedAsTheFormatSays) {
  MetricsSnapshot m;
  m.add("troupe_z", "help with \\ and\nnewline", MetricType::GAUGE, {{"member", "a\"b\\c\nd"}}, 1);
  auto text = m.toPrometheusText();
  EXPECT_NE(text.find("troupe_z{member=\"a\\\"b\\\\c\\nd\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# HELP troupe_z help with \\\\ and\\nnewline\n"), std::string::npos) << text;
}

TEST(MetricsSnapshotTest, SinceGivesWhatWasRecordedBetweenTwoReads) {
  LatencyHistogram h;
  h.record(1 * kj::MILLISECONDS);
  auto earlier = h;
  h.record(100 * kj::MILLISECONDS);
  h.record(100 * kj::MILLISECONDS);
  auto d = since(h, earlier);
  EXPECT_EQ(d.count, 2u);
  EXPECT_EQ(d.sumNanos, 200'000'000);
  EXPECT_NEAR(d.quantileSeconds(0.99), 0.0995, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Over HTTP.

// Runs `shellCommand` (through /bin/sh) and returns its exit status and what it printed.
std::pair<int, std::string> runShell(const std::string& shellCommand) {
  ChildProcess child("/bin/sh", {"-c", shellCommand + " 2>&1"});
  std::string out;
  for (std::string line; !(line = child.readLine()).empty();) out += line + "\n";
  int status = child.wait();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class HttpMetricsTest : public ::testing::Test {
protected:
  HttpMetricsTest() { setLoopCredentials(loop, Credentials::none()); }
  ~HttpMetricsTest() noexcept override {}

  void start(std::shared_ptr<Credentials> credentials = nullptr) {
    JobContext job;
    job.jobId = "job-1";
    job.taskIndex = 2;
    server = kj::heap<ActorServer>(loop, job,
                                   ActorServerOptions{.credentials = kj::mv(credentials),
                                                      .httpAddress = "127.0.0.1:0"});
    server->host<ScientificCalculator>("calc", kj::heap<CalculatorImpl>());
    server->host<Blocker>("blocker", kj::heap<BlockerImpl>(blocker), {.maxConcurrency = 0});
    address = server->listen("tcp://127.0.0.1:0");
  }

  std::string url(const char* path) { return server->httpUrl() + path; }

  template <typename Fn>
  bool pollUntil(Fn&& done) {
    for (int i = 0; i < 1000 && !done(); ++i) loop.waitScope().poll();
    return done();
  }

  EventLoop loop;
  BlockerState blocker;
  kj::Own<ActorServer> server;
  std::string address;
};

TEST_F(HttpMetricsTest, MetricsAreServedInThePrometheusFormatAndPromtoolAcceptsThem) {
  start();
  auto calc = ActorRef<Calculator>::connect(loop, address.c_str(), "calc");
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  EXPECT_EQ(awaitError(loop, divide(calc, 1, 0)).code, ErrorCode::FAILED);

  auto r = httpGet(loop, url("/metrics"));
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.contentType, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(
      r.contains("troupe_calls_total{job=\"job-1\",actor=\"calc\",method=\"add\",code=\"ok\"} 1\n"))
      << r.body;
  EXPECT_TRUE(r.contains(
      "troupe_calls_total{job=\"job-1\",actor=\"calc\",method=\"divide\",code=\"failed\"} 1\n"))
      << r.body;
  EXPECT_TRUE(r.contains("# TYPE troupe_call_duration_seconds histogram\n")) << r.body;

  // Prometheus' own parser.
  auto path = std::string(testing::TempDir()) + "troupe-metrics-" + std::to_string(getpid());
  std::ofstream(path) << r.body;
  auto [status, out] = runShell(std::string(TROUPE_PROMTOOL_PATH) + " check metrics < " + path);
  std::remove(path.c_str());
  EXPECT_EQ(status, 0) << out;
}

TEST_F(HttpMetricsTest, HealthzFollowsTheServersStateAndActorsListsWhatItHosts) {
  start();
  auto health = httpGet(loop, url("/healthz"));
  EXPECT_EQ(health.status, 200u);
  EXPECT_EQ(health.body, "ready\n");

  auto actors = httpGet(loop, url("/actors"));
  EXPECT_EQ(actors.status, 200u);
  EXPECT_EQ(actors.contentType, "application/json");
  capnp::JsonCodec json;
  capnp::MallocMessageBuilder message;
  auto info = message.initRoot<schema::ServerInfo>();
  ASSERT_FALSE(actors.body.empty());
  EXPECT_EQ(actors.body.back(), '\n');
  json.decode(kj::heapString(actors.body.data(), actors.body.size() - 1), info);
  EXPECT_EQ(info.getJobId(), "job-1");
  EXPECT_EQ(info.getTaskIndex(), 2u);
  EXPECT_EQ(info.getIncarnation(), server->incarnation());
  EXPECT_EQ(info.getState(), schema::EndpointState::READY);
  ASSERT_EQ(info.getActors().size(), 2u);
  EXPECT_EQ(info.getActors()[0].getName(), "calc");
  auto methods = info.getActors()[0].getMethods();
  ASSERT_EQ(methods.size(), 3u);
  EXPECT_EQ(methods[0], "sqrt");

  // The endpoint says where its metrics are.
  auto endpoints = server->endpoints();
  ASSERT_EQ(endpoints.size(), 2u);
  EXPECT_EQ(endpoints[0].metadata.at("metrics"), server->httpUrl());

  // Draining: a load balancer stops sending.
  auto b = ActorRef<Blocker>::connect(loop, address.c_str(), "blocker");
  auto held = b.call([](Blocker::Client c) {
    auto q = c.holdRequest();
    q.setTag("keep");
    return q.send();
  });
  ASSERT_TRUE(pollUntil([&]() { return blocker.started == 1; }));
  auto drained = server->drain();
  health = httpGet(loop, url("/healthz"));
  EXPECT_EQ(health.status, 503u);
  EXPECT_EQ(health.body, "draining\n");
  blocker.release("keep");
  await(loop, kj::mv(drained));
  EXPECT_EQ(server->httpUrl(), "");
}

TEST_F(HttpMetricsTest, OtherPathsAndMethodsAreRefusedClearly) {
  start();
  auto missing = httpGet(loop, url("/nope"));
  EXPECT_EQ(missing.status, 404u);
  EXPECT_TRUE(missing.contains("/metrics, /healthz and /actors")) << missing.body;
  auto post = httpGet(loop, url("/metrics"), "", kj::HttpMethod::POST);
  EXPECT_EQ(post.status, 405u);
  // The server keeps serving.
  EXPECT_EQ(httpGet(loop, url("/healthz")).status, 200u);
}

TEST_F(HttpMetricsTest, WithAClusterTokenOnlyHealthzIsOpen) {
  start(std::make_shared<Credentials>(CredentialsOptions{.token = "s3cret-token"}));
  auto refused = httpGet(loop, url("/metrics"));
  EXPECT_EQ(refused.status, 401u);
  EXPECT_FALSE(refused.contains("troupe_")) << refused.body;
  EXPECT_EQ(httpGet(loop, url("/actors"), "wrong").status, 401u);
  EXPECT_EQ(httpGet(loop, url("/metrics"), "s3cret-token").status, 200u);
  EXPECT_EQ(httpGet(loop, url("/actors"), "s3cret-token").status, 200u);
  EXPECT_EQ(httpGet(loop, url("/healthz")).status, 200u);
}

TEST_F(HttpMetricsTest, ABadHttpAddressIsRefusedWithItsReason) {
  JobContext job;
  auto failure = thrownBy(
      [&]() { ActorServer s(loop, job, ActorServerOptions{.httpAddress = "unix:/tmp/x"}); });
  EXPECT_EQ(failure.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(failure.mentions("HOST:PORT")) << failure.text;
}

}  // namespace
}  // namespace troupe::test
