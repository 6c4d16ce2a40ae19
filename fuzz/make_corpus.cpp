// Writes the fuzz targets' seed corpora (README.md says how they are used):
//
//   make_fuzz_corpus <folder>      writes <folder>/<target>/<seed> for every target
//
// The server targets' seeds are what troupe's own clients (ActorRef, Channel, RegistryResolver)
// sent a real server, recorded by a proxy between them; the frame reader's are the same bytes
// behind a read size; the registry wire target's are the registry's values serialized; the
// metrics text target's are what that server's metrics printed, and texts; the other text
// targets' are written out below.

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <functional>
#include <string>

#include <capnp/serialize.h>
#include <kj/debug.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/net/channel.h"
#include "troupe/resolver/registry_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "troupe/resolver/registry_wire.h"
#include "fuzz/recording_proxy.h"
#include "tests/support/test_actors.h"

namespace troupe::fuzz {
namespace {

std::shared_ptr<Credentials> credentials(std::string token = {}) {
  return std::make_shared<Credentials>(CredentialsOptions{.token = kj::mv(token)});
}

class Corpus {
public:
  explicit Corpus(std::string folder) : folder(kj::mv(folder)) { makeFolder(this->folder); }

  void write(kj::StringPtr target, kj::StringPtr name, kj::ArrayPtr<const kj::byte> bytes) {
    auto dir = folder + "/" + target.cStr();
    makeFolder(dir);
    auto path = dir + "/" + name.cStr();
    FILE* f = fopen(path.c_str(), "wb");
    KJ_REQUIRE(f != nullptr, "cannot write", path);
    KJ_REQUIRE(fwrite(bytes.begin(), 1, bytes.size(), f) == bytes.size(), "cannot write", path);
    fclose(f);
  }

  void write(kj::StringPtr target, kj::StringPtr name, kj::StringPtr text) {
    write(target, name, text.asBytes());
  }

  // `prefix`, then a Cap'n Proto message in the standard framing.
  void write(kj::StringPtr target, kj::StringPtr name, kj::byte prefix,
             capnp::MessageBuilder& message) {
    auto flat = capnp::messageToFlatArray(message);
    auto bytes = kj::heapArray<kj::byte>(flat.asBytes().size() + 1);
    bytes[0] = prefix;
    memcpy(bytes.begin() + 1, flat.asBytes().begin(), flat.asBytes().size());
    write(target, name, bytes);
  }

private:
  static void makeFolder(const std::string& path) {
    KJ_REQUIRE(mkdir(path.c_str(), 0755) == 0 || errno == EEXIST, "cannot make", path);
  }

  std::string folder;
};

// Runs `session` on a channel to the proxy, closes the channel, and returns what it sent.
kj::Array<kj::byte> record(EventLoop& loop, RecordingProxy& proxy,
                           std::function<void(Channel&)> session,
                           std::shared_ptr<Credentials> creds = credentials()) {
  auto recorded = proxy.record().eagerlyEvaluate(nullptr);
  {
    auto channel = Channel::open(loop, proxy.address().c_str(), {.credentials = creds});
    session(*channel);
  }
  return recorded.wait(loop.waitScope());
}

template <typename T>
ActorRef<T> actor(Channel& channel, kj::StringPtr name) {
  return ActorRef<T>(channel.addRef(), name);
}

// Waits for `promise`, which is expected to fail.
template <typename P>
void refused(P&& promise, kj::WaitScope& ws) {
  KJ_ASSERT(kj::runCatchingExceptions([&]() { promise.wait(ws); }) != nullptr, "not refused");
}

void echoOnce(EventLoop& loop, Channel& ch, size_t bytes) {
  auto echo = actor<test::Echo>(ch, "echo");
  echo.call([bytes](test::Echo::Client c) {
        auto q = c.echoRequest();
        auto payload = q.initPayload(bytes);
        for (size_t i = 0; i < bytes; ++i) payload[i] = 'a' + i % 26;
        return q.send();
      })
      .wait(loop.waitScope());
}

// Sessions with an ActorServer hosting what actor_server_fuzz.cpp hosts.
void actorServerSeeds(Corpus& corpus) {
  EventLoop loop;
  setLoopCredentials(loop, credentials());
  auto& ws = loop.waitScope();
  JobContext job;
  job.jobId = "fuzz";
  ActorServer server(loop, job);
  server.host<test::ScientificCalculator>("calc", kj::heap<test::CalculatorImpl>());
  server.host<test::Echo>("echo", kj::heap<test::EchoImpl>());
  server.host<test::Member>("member", kj::heap<test::MemberImpl>("member"));
  RecordingProxy proxy(loop, server.listen("tcp://127.0.0.1:0"));

  struct Seed {
    kj::StringPtr name;
    std::function<void(Channel&)> session;
  };
  Seed seeds[] = {
      {"ping", [&](Channel& ch) { actor<test::Echo>(ch, "echo").ping().wait(ws); }},
      {"echo", [&](Channel& ch) { echoOnce(loop, ch, 5); }},
      {"echo_pipelined",
       [&](Channel& ch) {
         auto echo = actor<test::Echo>(ch, "echo");
         kj::Vector<kj::Promise<void>> calls;
         for (int i = 0; i < 3; ++i) {
           calls.add(echo.call([](test::Echo::Client c) {
                           auto q = c.echoRequest();
                           q.setPayload(kj::StringPtr("again").asBytes());
                           return q.send();
                         })
                         .ignoreResult());
         }
         kj::joinPromises(calls.releaseAsArray()).wait(ws);
       }},
      {"calc_add",
       [&](Channel& ch) {
         actor<test::ScientificCalculator>(ch, "calc")
             .call([](test::ScientificCalculator::Client c) {
               auto q = c.addRequest();
               q.setA(2);
               q.setB(3);
               return q.send();
             })
             .wait(ws);
       }},
      {"calc_divide_by_zero",
       [&](Channel& ch) {
         refused(actor<test::ScientificCalculator>(ch, "calc")
                     .call([](test::ScientificCalculator::Client c) {
                       auto q = c.divideRequest();
                       q.setA(7);
                       return q.send();
                     }),
                 ws);
       }},
      // Results that do not fit an Int64, which the test calculator once did not refuse.
      {"calc_add_overflow",
       [&](Channel& ch) {
         refused(actor<test::ScientificCalculator>(ch, "calc")
                     .call([](test::ScientificCalculator::Client c) {
                       auto q = c.addRequest();
                       q.setA(INT64_MAX);
                       q.setB(1);
                       return q.send();
                     }),
                 ws);
       }},
      {"calc_divide_overflow",
       [&](Channel& ch) {
         refused(actor<test::ScientificCalculator>(ch, "calc")
                     .call([](test::ScientificCalculator::Client c) {
                       auto q = c.divideRequest();
                       q.setA(INT64_MIN);
                       q.setB(-1);
                       return q.send();
                     }),
                 ws);
       }},
      {"calc_sqrt",
       [&](Channel& ch) {
         actor<test::ScientificCalculator>(ch, "calc")
             .call([](test::ScientificCalculator::Client c) {
               auto q = c.sqrtRequest();
               q.setX(2);
               return q.send();
             })
             .wait(ws);
       }},
      {"member",
       [&](Channel& ch) {
         auto member = actor<test::Member>(ch, "member");
         member.call([](test::Member::Client c) { return c.whoamiRequest().send(); }).wait(ws);
         refused(member.call([](test::Member::Client c) {
           auto q = c.raiseRequest();
           q.setMessage("no");
           return q.send();
         }),
                 ws);
         refused(member.call([](test::Member::Client c) {
           auto q = c.throwRequest();
           q.setDescription("busy");
           q.setType(1);
           return q.send();
         }),
                 ws);
       }},
      {"actor_not_found",
       [&](Channel& ch) {
         refused(actor<test::Echo>(ch, "nope").call([](test::Echo::Client c) {
           return c.whoamiRequest().send();
         }),
                 ws);
       }},
      {"host",
       [&](Channel& ch) {
         auto host = ch.host();
         host.listActorsRequest().send().wait(ws);
         auto schema = host.getSchemaRequest();
         schema.setName("calc");
         schema.send().wait(ws);
         host.pingRequest().send().wait(ws);
         auto drain = host.drainRequest();
         drain.setGraceMillis(1);
         refused(drain.send(), ws);
       }},
  };
  for (auto& seed : seeds) {
    auto bytes = record(loop, proxy, seed.session);
    corpus.write("actor_server", seed.name, bytes);
    // The same traffic for the frame reader, read whole and one byte at a time.
    for (kj::byte step : {0, 1}) {
      auto framed = kj::heapArray<kj::byte>(bytes.size() + 1);
      framed[0] = step;
      memcpy(framed.begin() + 1, bytes.begin(), bytes.size());
      corpus.write("frame_reader", kj::str(seed.name, "_step", step), framed);
    }
  }
  auto token = record(
      loop, proxy, [&](Channel& ch) { echoOnce(loop, ch, 5); }, credentials("a cluster token"));
  corpus.write("actor_server", "token", token);

  // A message over the size up to which writes are batched, read 7 bytes at a time.
  auto large = record(loop, proxy, [&](Channel& ch) { echoOnce(loop, ch, 20000); });
  auto framed = kj::heapArray<kj::byte>(large.size() + 1);
  framed[0] = 7;
  memcpy(framed.begin() + 1, large.begin(), large.size());
  corpus.write("frame_reader", "echo_large_step7", framed);

  // What the server's /metrics says of member's calls after these sessions, for metrics_text.
  auto metrics = server.metrics();
  MetricsSnapshot member;
  for (auto& [name, family] : metrics.families()) {
    for (auto& s : family.samples) {
      if (std::find(s.labels.begin(), s.labels.end(),
                    std::pair<std::string, std::string>("actor", "member")) == s.labels.end()) {
        continue;
      }
      if (family.type == MetricType::HISTOGRAM) {
        member.addHistogram(name, family.help, s.labels, s.histogram);
      } else {
        member.add(name, family.help, family.type, s.labels, s.value);
      }
    }
  }
  corpus.write("metrics_text", "server_member", member.toPrometheusText());
}

Endpoint sampleEndpoint() {
  Endpoint e;
  e.name = "fuzz/echo-0";
  e.address = "tcp://127.0.0.1:4000";
  e.jobId = "fuzz";
  e.actor = "echo";
  e.incarnation = 7;
  e.state = EndpointState::READY;
  e.metadata["zone"] = "a";
  e.metadata["gpu"] = "";
  return e;
}

// Sessions of a RegistryResolver (and a plain Channel) with a RegistryServer.
void registryServerSeeds(Corpus& corpus) {
  EventLoop loop;
  setLoopCredentials(loop, credentials());
  auto& ws = loop.waitScope();
  RegistryServer registry(loop);
  RecordingProxy proxy(loop, registry.listen("tcp://127.0.0.1:0"));
  auto resolverSession = [&](std::function<void(RegistryResolver&)> session) {
    auto recorded = proxy.record().eagerlyEvaluate(nullptr);
    {
      RegistryResolver resolver(loop, proxy.address().c_str());
      session(resolver);
    }
    return recorded.wait(ws);
  };

  corpus.write("registry_server", "resolve",
               resolverSession([&](RegistryResolver& r) { r.resolve("fuzz/").wait(ws); }));
  corpus.write("registry_server", "register", resolverSession([&](RegistryResolver& r) {
                 auto registration = r.registerEndpoint(sampleEndpoint());
                 registration->whenRegistered().wait(ws);
                 registration->setState(EndpointState::DRAINING);
                 r.resolve("fuzz/").wait(ws);
               }));
  corpus.write("registry_server", "watch", resolverSession([&](RegistryResolver& r) {
                 auto registration = r.registerEndpoint(sampleEndpoint());
                 registration->whenRegistered().wait(ws);
                 auto watch = r.watch("fuzz/");
                 watch->next().wait(ws);  // ADDED
                 watch->next().wait(ws);  // SYNCED
               }));
  corpus.write("registry_server", "jobs", resolverSession([&](RegistryResolver& r) {
                 auto credential = r.createJob("batch").wait(ws);
                 r.setJobStatus({"batch", JobState::ENDED, "done"}, credential).wait(ws);
                 r.jobStatus("batch").wait(ws);
                 refused(r.setJobStatus({"batch", JobState::RUNNING, ""}, "wrong"), ws);
               }));
}

// Registry values in the standard framing; one spread over many small segments.
void registryWireSeeds(Corpus& corpus) {
  auto endpoint = sampleEndpoint();
  {
    capnp::MallocMessageBuilder m;
    endpoint.toCapnp(m.initRoot<schema::Endpoint>());
    corpus.write("registry_wire", "endpoint", '0', m);
  }
  {
    capnp::MallocMessageBuilder m(8, capnp::AllocationStrategy::FIXED_SIZE);
    endpoint.toCapnp(m.initRoot<schema::Endpoint>());
    corpus.write("registry_wire", "endpoint_segments", '0', m);
    corpus.write("frame_reader", "endpoint_segments_step3", 3, m);
  }
  {
    capnp::MallocMessageBuilder m;
    toCapnp(JobStatus{"batch", JobState::ENDED, "failed: replica 3 exited 1"},
            m.initRoot<schema::JobStatus>());
    corpus.write("registry_wire", "job_status", '1', m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto events = m.initRoot<schema::Watcher::EventsParams>().initEvents(5);
    toCapnp(WatchEvent{WatchEvent::Type::ADDED, endpoint, {}}, events[0]);
    toCapnp(WatchEvent{WatchEvent::Type::CHANGED, endpoint, {}}, events[1]);
    toCapnp(WatchEvent{WatchEvent::Type::REMOVED, endpoint, {}}, events[2]);
    toCapnp(WatchEvent{WatchEvent::Type::SYNCED, {}, {}}, events[3]);
    toCapnp(WatchEvent{WatchEvent::Type::JOB_ENDED, {}, {"fuzz", JobState::ENDED, "done"}},
            events[4]);
    corpus.write("registry_wire", "events", '3', m);
  }
  {
    capnp::MallocMessageBuilder m;
    toCapnp(WatchEvent{WatchEvent::Type::ADDED, endpoint, {}}, m.initRoot<schema::WatchEvent>());
    corpus.write("registry_wire", "event_added", '2', m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto list = m.initRoot<schema::Registry::ResolveResults>().initEndpoints(2);
    endpoint.toCapnp(list[0]);
    endpoint.name = "fuzz/echo-1";
    endpoint.address = "unix:/tmp/echo.sock";
    endpoint.toCapnp(list[1]);
    corpus.write("registry_wire", "resolve_results", '4', m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto p = m.initRoot<schema::Registry::RegisterParams>();
    sampleEndpoint().toCapnp(p.initEndpoint());
    p.setTtlMillis(500);
    p.setJobCredential(kj::StringPtr("0123456789abcdef").asBytes());
    corpus.write("registry_wire", "register_params", '5', m);
  }
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<schema::Registry::ResolveParams>().setPrefix("fuzz/echo-");
    corpus.write("registry_wire", "resolve_params", '6', m);
  }
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<schema::Registry::WatchParams>().setPrefix("fuzz/");
    corpus.write("registry_wire", "watch_params", '7', m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto p = m.initRoot<schema::Registry::SetJobStatusParams>();
    toCapnp(JobStatus{"batch", JobState::RUNNING, ""}, p.initStatus());
    corpus.write("registry_wire", "set_job_status_params", '8', m);
  }
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<schema::Registry::JobStatusParams>().setJobId("batch");
    corpus.write("registry_wire", "job_status_params", '9', m);
  }
}

// Texts for parse_fuzz.cpp: the first character picks the parser.
void parseSeeds(Corpus& corpus) {
  kj::StringPtr seeds[][2] = {
      {"address_tcp", "0tcp://127.0.0.1:4000"},
      {"address_tls_v6", "0tls://[fe80::1%eth0]:443"},
      {"address_unix", "0unix:/tmp/troupe.sock"},
      {"address_unix_slashes", "0unix:////tmp/x"},
      {"address_bare", "0localhost:80"},
      {"name", "1job-1/ps-0"},
      {"name_dashes", "1a.b_c/x-y-4294967295"},
      {"name_leading_zero", "1job/actor-01"},
      {"number", "218446744073709551615"},
      {"number_over", "218446744073709551616"},
      {"number_zeros", "2007"},
      {"url_registry", "3registry://127.0.0.1:7700?ttl_ms=500"},
      {"url_registry_tls", "3registry+tls://[::1]"},
      {"url_registry_unix", "3registry+unix:/tmp/registry.sock"},
      {"url_fixed", "3fixed:job/a-0=tcp://h:1, job/b-1 = unix:/x"},
      {"fixed_file",
       "4job/a-0 tcp://127.0.0.1:1 ready zone=a # here\n\njob/a-1 unix:/s draining\r\n"},
      {"prefix", "5job/a-"},
      {"environment", "6TROUPE_JOB_ID=job\nTROUPE_TASK_INDEX=2\nTROUPE_NUM_TASKS=4\n"},
      {"environment_slurm",
       "6SLURM_JOB_ID=12\nSLURM_PROCID=1\nSLURM_NTASKS=2\nJOB_COMPLETION_INDEX=5\n"},
  };
  for (auto& seed : seeds) corpus.write("parse", seed[0], seed[1]);
}

// Inputs for call_json_fuzz.cpp: a method of call_params.capnp, a newline, its JSON.
void callJsonSeeds(Corpus& corpus) {
  kj::StringPtr seeds[][2] = {
      {"scalars", "scalars\n{\"b\":true,\"i8\":-128,\"u16\":65535,\"i64\":\"-9223372036854775808\","
                  "\"u64\":\"18446744073709551615\",\"f32\":1.5e3,\"f64\":\"NaN\"}"},
      {"texts",
       "texts\n{\"text\":\"h\\u00e9\\n\",\"data\":\"aGk-_w\",\"color\":\"blue\",\"nothing\":null}"},
      {"lists",
       "lists\n{\"ints\":[1,\"2\"],\"floats\":[0.5],\"bools\":[true,false],\"texts\":[\"a\"],"
       "\"blobs\":[\"AA==\"],\"points\":[{\"x\":1,\"label\":\"p\"}],\"nested\":[[1,2],[]],"
       "\"colors\":[\"red\"],\"voids\":[null]}"},
      {"structs", "structs\n{\"point\":{\"x\":-1,\"y\":2},\"shape\":{\"square\":{\"x\":1}},"
                  "\"shapes\":[{\"circle\":2,\"tags\":[\"t\"]},{\"none\":null}]}"},
      {"place", "place\n{\"at\":{\"row\":1,\"column\":2},\"color\":\"green\",\"weight\":2}"},
      {"defaults", "defaults\n{}"},
      {"none", "none\n{ }"},
      {"capability", "capability\n{\"peer\":null}"},
      {"inherited", "more\n{\"x\":1}"},
      {"unknown_field", "scalars\n{\"nope\":1}"},
      {"not_json", "lists\n{\"ints\":[1,]}"},
  };
  for (auto& seed : seeds) corpus.write("call_json", seed[0], seed[1]);
}

// Texts for metrics_text_fuzz.cpp: the Prometheus text format as troupe and other exporters
// write it, and some it refuses.
void metricsTextSeeds(Corpus& corpus) {
  kj::StringPtr seeds[][2] = {
      {"counter_and_gauge",
       "# HELP troupe_calls_total Calls finished.\n# TYPE troupe_calls_total counter\n"
       "troupe_calls_total{job=\"j\",actor=\"a\",method=\"m\",code=\"ok\"} 3\n"
       "# HELP troupe_calls_in_flight Calls running.\n# TYPE troupe_calls_in_flight gauge\n"
       "troupe_calls_in_flight{job=\"j\",actor=\"a\",method=\"m\"} 0\n"},
      {"histogram", "# HELP t_seconds Latency.\n# TYPE t_seconds histogram\n"
                    "t_seconds_bucket{le=\"5e-06\"} 1\nt_seconds_bucket{le=\"0.001\"} 2\n"
                    "t_seconds_bucket{le=\"2.5\"} 4\nt_seconds_bucket{le=\"+Inf\"} 5\n"
                    "t_seconds_sum 90.25\nt_seconds_count 5\n"},
      {"foreign_histogram",
       "# TYPE http_seconds histogram\nhttp_seconds_bucket{path=\"/\",le=\"0.3\"} 7\n"
       "http_seconds_bucket{path=\"/\",le=\"120\"} 9\nhttp_seconds_count{path=\"/\"} 10\n"},
      {"escapes", "# HELP z back\\\\slash and\\nnewline\n# TYPE z gauge\n"
                  "z{member=\"a\\\"b\\\\c\\nd\",empty=\"\"} -1.5e-3\n"},
      {"others", "# a comment\n# UNIT x seconds\n\ngo_goroutines 12\r\n"
                 "  spaced { a = \"1\" , b=\"2\", } 3 1700000000000\n"
                 "# TYPE rpc summary\nrpc{quantile=\"0.5\"} 0.25\nrpc_sum 17\nrpc_count 40\n"
                 "# TYPE up untyped\nup NaN\nbig -Inf -5\nlast +Inf"},
      {"malformed", "x{a=\"1\" 2\n"},
      {"decreasing", "# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"2\"} 2\nh_count 3\n"},
  };
  for (auto& seed : seeds) corpus.write("metrics_text", seed[0], seed[1]);
}

}  // namespace
}  // namespace troupe::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <corpus folder>\n", argv[0]);
    return 2;
  }
  troupe::fuzz::Corpus corpus(argv[1]);
  troupe::fuzz::actorServerSeeds(corpus);
  troupe::fuzz::registryServerSeeds(corpus);
  troupe::fuzz::registryWireSeeds(corpus);
  troupe::fuzz::parseSeeds(corpus);
  troupe::fuzz::callJsonSeeds(corpus);
  troupe::fuzz::metricsTextSeeds(corpus);
  return 0;
}
