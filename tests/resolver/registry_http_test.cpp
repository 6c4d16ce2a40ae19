// The registry's HTTP side: the dashboard's API (state, live events, an endpoint's metrics
// through the registry), its own /metrics, and who may read them.

#include <fstream>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_server.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/calculator_calls.h"
#include "tests/support/http_get.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"

namespace troupe::test {
namespace {

using RegisterResponse = capnp::Response<schema::Registry::RegisterResults>;

class RegistryHttpTest : public ::testing::Test {
protected:
  RegistryHttpTest() { setLoopCredentials(loop, Credentials::none()); }
  ~RegistryHttpTest() noexcept override {}

  void start(std::shared_ptr<Credentials> credentials = nullptr) {
    server = kj::heap<RegistryServer>(loop, RegistryServerOptions{.credentials = credentials});
    url = server->listenHttp("127.0.0.1:0");
  }

  RegisterResponse add(const Endpoint& e) {
    auto request = server->capability().registerRequest();
    e.toCapnp(request.initEndpoint());
    request.setTtlMillis(60000);
    return await(loop, request.send());
  }

  EventLoop loop;
  kj::Own<RegistryServer> server;
  std::string url;
};

// Reads an open response body until it holds `text`; fails the test after PATIENCE.
struct BodyReader {
  kj::Own<kj::AsyncInputStream> body;
  std::string seen;

  bool readUntil(EventLoop& loop, const char* text) {
    auto deadline = loop.timer().now() + PATIENCE;
    while (seen.find(text) == std::string::npos) {
      if (loop.timer().now() > deadline) return false;
      char buffer[4096];
      auto n = await(loop, body->tryRead(buffer, 1, sizeof(buffer)));
      if (n == 0) return false;
      seen.append(buffer, n);
    }
    return true;
  }
};

TEST_F(RegistryHttpTest, StateListsJobsAndEndpointsAndEventsFollowChangesLive) {
  start();
  kj::Maybe<RegisterResponse> first = add(endpoint("calc/calc-0", "tcp://127.0.0.1:4001"));
  auto state = httpGet(loop, url + "/api/state");
  EXPECT_EQ(state.status, 200u);
  EXPECT_EQ(state.contentType, "application/json");
  EXPECT_TRUE(state.contains("{\"jobId\":\"calc\",\"state\":\"running\"")) << state.body;
  EXPECT_TRUE(state.contains("\"name\":\"calc/calc-0\"")) << state.body;
  EXPECT_TRUE(state.contains("\"address\":\"tcp://127.0.0.1:4001\"")) << state.body;

  kj::HttpHeaderTable table;
  auto client = kj::newHttpClient(loop.timer(), table, loop.network(), nullptr);
  kj::HttpHeaders headers(table);
  auto response = await(
      loop, client->request(kj::HttpMethod::GET, kj::str(url, "/api/events"), headers, uint64_t{0})
                .response);
  EXPECT_EQ(response.statusCode, 200u);
  EXPECT_EQ(KJ_ASSERT_NONNULL(response.headers->get(kj::HttpHeaderId::CONTENT_TYPE)),
            "text/event-stream");
  BodyReader events{kj::mv(response.body), {}};
  ASSERT_TRUE(events.readUntil(loop, "data: {\"synced\":null}\n\n")) << events.seen;
  EXPECT_NE(events.seen.find("data: {\"added\":{\"name\":\"calc/calc-0\""), std::string::npos)
      << events.seen;

  // A new endpoint and one that goes arrive without asking again.
  auto second = add(endpoint("calc/calc-1", "tcp://127.0.0.1:4002"));
  ASSERT_TRUE(events.readUntil(loop, "\"added\":{\"name\":\"calc/calc-1\"")) << events.seen;
  first = nullptr;  // releasing the lease removes the entry
  ASSERT_TRUE(events.readUntil(loop, "\"removed\":{\"name\":\"calc/calc-0\"")) << events.seen;

  // The stream is counted, and the registry's metrics say what happened.
  auto metrics = loop.metrics().collect();
  EXPECT_EQ(metrics.value("troupe_registry_dashboard_streams"), 1);
  EXPECT_EQ(metrics.value("troupe_registry_registrations_total"), 2);
  EXPECT_EQ(metrics.value("troupe_registry_endpoints", {{"state", "ready"}}), 1);
  EXPECT_EQ(metrics.value("troupe_registry_watchers"), 1);
  events.body = nullptr;
  client = nullptr;
}

TEST_F(RegistryHttpTest, TheRegistrysMetricsPassPromtoolAndCountRefusals) {
  start();
  auto held = add(endpoint("job-a/x-0"));
  auto refused = server->capability().registerRequest();
  endpoint("job-a/x-0", "tcp://127.0.0.1:4000", 1).toCapnp(refused.initEndpoint());
  EXPECT_EQ(awaitError(loop, refused.send()).code, ErrorCode::NAME_TAKEN);

  auto r = httpGet(loop, url + "/metrics");
  EXPECT_EQ(r.status, 200u);
  EXPECT_TRUE(r.contains("troupe_registry_registrations_refused_total{code=\"name_taken\"} 1\n"))
      << r.body;
  EXPECT_TRUE(r.contains("troupe_registry_leases 1\n")) << r.body;
  auto path = std::string(testing::TempDir()) + "troupe-registry-metrics-" +
              std::to_string(getpid());
  std::ofstream(path) << r.body;
  ChildProcess promtool("/bin/sh", {"-c", std::string(TROUPE_PROMTOOL_PATH) + " check metrics < " +
                                              path + " 2>&1"});
  std::string out;
  for (std::string line; !(line = promtool.readLine()).empty();) out += line + "\n";
  int status = promtool.wait();
  std::remove(path.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
}

TEST_F(RegistryHttpTest, AnEndpointsMetricsComeThroughTheRegistryFromItsOwnHostOnly) {
  start();
  JobContext job;
  job.jobId = "calc";
  ActorServer replica(loop, job, ActorServerOptions{.httpAddress = "127.0.0.1:0"});
  replica.host<Calculator>("calc", kj::heap<CalculatorImpl>());
  replica.listen("tcp://127.0.0.1:0");
  auto published = replica.endpoints()[0];
  ASSERT_EQ(published.metadata.at("metrics"), replica.httpUrl());
  auto lease = add(published);

  auto r = httpGet(loop, url + "/api/metrics?endpoint=calc%2Fcalc-0");
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_TRUE(
      r.contains("troupe_calls_started_total{job=\"calc\",actor=\"calc\",method=\"add\"} 0"))
      << r.body;

  // An endpoint that names another host for its metrics is not fetched from.
  auto elsewhere = endpoint("calc/calc-1", "tcp://127.0.0.1:4005");
  elsewhere.metadata["metrics"] = "http://192.0.2.1:9100";
  auto other = add(elsewhere);
  r = httpGet(loop, url + "/api/metrics?endpoint=calc/calc-1");
  EXPECT_EQ(r.status, 502u);
  EXPECT_TRUE(r.contains("only from an endpoint's own host")) << r.body;

  auto none = add(endpoint("calc/calc-2", "tcp://127.0.0.1:4006"));
  r = httpGet(loop, url + "/api/metrics?endpoint=calc/calc-2");
  EXPECT_EQ(r.status, 404u);
  EXPECT_TRUE(r.contains("serves no metrics")) << r.body;
  r = httpGet(loop, url + "/api/metrics?endpoint=calc/nope-0");
  EXPECT_EQ(r.status, 404u);
  r = httpGet(loop, url + "/api/metrics");
  EXPECT_EQ(r.status, 400u);
}

TEST_F(RegistryHttpTest, HistoryKeepsCallsErrorsByCodeAndLatencyPerEndpointAndJob) {
  server = kj::heap<RegistryServer>(loop, RegistryServerOptions{
                                              .historyInterval = 50 * kj::MILLISECONDS});
  url = server->listenHttp("127.0.0.1:0");
  JobContext job;
  job.jobId = "calc";
  ActorServer replica(loop, job, ActorServerOptions{.httpAddress = "127.0.0.1:0"});
  replica.host<Calculator>("calc", kj::heap<CalculatorImpl>());
  auto address = replica.listen("tcp://127.0.0.1:0");
  auto lease = add(replica.endpoints()[0]);

  auto calc = ActorRef<Calculator>::connect(loop, address.c_str(), "calc");
  // Calls until the job's history shows both kinds: each read sees what came since the last.
  auto deadline = loop.timer().now() + PATIENCE;
  HttpResult history;
  while (!history.contains("\"code\":\"failed\"") || !history.contains("\"name\":\"calc\"")) {
    ASSERT_LT(loop.timer().now(), deadline) << history.body;
    for (int i = 0; i < 10; ++i) EXPECT_EQ(await(loop, test::add(calc, i, 1)), i + 1);
    EXPECT_THROW(await(loop, divide(calc, 1, 0)), kj::Exception);
    history = httpGet(loop, url + "/api/history?job=calc");
  }
  EXPECT_EQ(history.status, 200u);
  EXPECT_TRUE(history.contains("\"intervalMillis\":50,\"lengthMillis\":900000")) << history.body;
  EXPECT_TRUE(history.contains("\"endpoints\":[{\"name\":\"calc/calc-0\"")) << history.body;
  // Every job's totals, without their endpoints.
  auto all = httpGet(loop, url + "/api/history");
  EXPECT_TRUE(all.contains("\"jobs\":[{\"name\":\"calc\"")) << all.body;
  EXPECT_FALSE(all.contains("calc/calc-0")) << all.body;
}

TEST_F(RegistryHttpTest, AJobPageHasItsEventsAndSaysWhyItHasNoLauncherDetail) {
  start();
  auto lease = add(endpoint("calc/calc-0", "tcp://127.0.0.1:4001"));
  auto page = httpGet(loop, url + "/api/job?job=calc");
  EXPECT_EQ(page.status, 200u);
  EXPECT_TRUE(page.contains("\"text\":\"calc/calc-0 registered at tcp://127.0.0.1:4001"))
      << page.body;
  EXPECT_TRUE(page.contains("\"detailError\":\"no launcher created this job")) << page.body;
  EXPECT_EQ(httpGet(loop, url + "/api/job?job=nope").status, 404u);
  EXPECT_EQ(httpGet(loop, url + "/api/job").status, 400u);
}

TEST_F(RegistryHttpTest, WithAClusterTokenThePageIsOpenButTheDataNeedsTheToken) {
  start(std::make_shared<Credentials>(CredentialsOptions{.token = "tok-123"}));
  auto page = httpGet(loop, url + "/");
  EXPECT_EQ(page.status, 200u);
  EXPECT_EQ(page.contentType, "text/html; charset=utf-8");
  bool policy = false;
  for (auto& [name, value] : page.headers) {
    if (name == "Content-Security-Policy") {
      policy = value.find("script-src 'self'") != std::string::npos;
    }
  }
  EXPECT_TRUE(policy);
  EXPECT_EQ(httpGet(loop, url + "/dashboard.js").contentType, "text/javascript; charset=utf-8");
  EXPECT_EQ(httpGet(loop, url + "/api/state").status, 401u);
  EXPECT_EQ(httpGet(loop, url + "/api/events").status, 401u);
  EXPECT_EQ(httpGet(loop, url + "/api/history").status, 401u);
  EXPECT_EQ(httpGet(loop, url + "/api/job?job=calc").status, 401u);
  EXPECT_EQ(httpGet(loop, url + "/charts.js").status, 200u);
  EXPECT_EQ(httpGet(loop, url + "/job.js").status, 200u);
  EXPECT_EQ(httpGet(loop, url + "/metrics", "wrong").status, 401u);
  EXPECT_EQ(httpGet(loop, url + "/api/state", "tok-123").status, 200u);
  EXPECT_EQ(httpGet(loop, url + "/healthz").status, 200u);
}

}  // namespace
}  // namespace troupe::test
