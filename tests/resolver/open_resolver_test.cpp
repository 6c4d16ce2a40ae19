// openResolver: each URL scheme opens the right resolver, anything else is refused by name.

#include "troupe/resolver/open_resolver.h"

#include <unistd.h>

#include <cstdio>

#include <gtest/gtest.h>

#include "troupe/base/errors.h"
#include "troupe/resolver/fixed_resolver.h"
#include "troupe/resolver/registry_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/registry_helpers.h"

namespace troupe {
namespace {

using test::await;

TEST(OpenResolver, RegistryUrlsOpenARegistryResolver) {
  EventLoop loop;
  RegistryServer server(loop);
  auto tcp = server.listen("tcp://127.0.0.1:0");
  auto path = test::socketPath("open");
  server.listen(("unix:" + path).c_str());

  // One name per URL: the first registration's release reaches the registry only as its
  // connection closes, which may be after the second registers.
  int index = 0;
  for (auto url : {"registry://" + tcp.substr(strlen("tcp://")), "registry+unix:" + path}) {
    auto resolver = openResolver(loop, url.c_str());
    EXPECT_NE(dynamic_cast<RegistryResolver*>(resolver.get()), nullptr) << url;
    auto name = "job/ps-" + std::to_string(index++);
    auto registration = resolver->registerEndpoint(test::endpoint(name));
    await(loop, registration->whenRegistered());
    auto found = await(loop, resolver->resolve(name.c_str()));
    ASSERT_EQ(found.size(), 1u) << url;
    EXPECT_EQ(found[0].name, name);
  }
  // Lease options ride on the URL.
  auto shortLeases = openResolver(loop, ("registry+unix:" + path + "?ttl_ms=500").c_str());
  auto registration = shortLeases->registerEndpoint(test::endpoint("job/ps-9"));
  await(loop, registration->whenRegistered());
  EXPECT_EQ(await(loop, shortLeases->resolve("job/ps-9")).size(), 1u);

  // Without a port, the daemon's default one; nothing is contacted yet.
  auto byDefault = openResolver(loop, "registry://localhost");
  EXPECT_NE(dynamic_cast<RegistryResolver*>(byDefault.get()), nullptr);
}

TEST(OpenResolver, FixedUrlsOpenAFixedResolver) {
  EventLoop loop;
  auto resolver = openResolver(loop, "fixed:job/ps-1=unix:/tmp/ps1.sock,job/ps-0=127.0.0.1:4000");
  EXPECT_NE(dynamic_cast<FixedResolver*>(resolver.get()), nullptr);
  auto found = resolver->resolve("job/").wait(loop.waitScope());
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].name, "job/ps-0");
  EXPECT_EQ(found[0].address, "tcp://127.0.0.1:4000");
  EXPECT_EQ(found[1].address, "unix:/tmp/ps1.sock");
}

TEST(OpenResolver, FileUrlsReadAFixedResolverFile) {
  EventLoop loop;
  auto path = "/tmp/troupe-open-resolver-" + std::to_string(getpid()) + ".txt";
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("# two replicas\njob/ps-0 tcp://127.0.0.1:4000 ready\njob/ps-1 unix:/tmp/x.sock draining\n",
        f);
  fclose(f);
  for (auto url : {"file:" + path, "file://" + path}) {
    auto resolver = openResolver(loop, url.c_str());
    EXPECT_NE(dynamic_cast<FixedResolver*>(resolver.get()), nullptr);
    auto found = resolver->resolve("").wait(loop.waitScope());
    ASSERT_EQ(found.size(), 2u) << url;
    EXPECT_EQ(found[1].state, EndpointState::DRAINING);
  }
  unlink(path.c_str());
}

TEST(OpenResolver, AnythingElseIsRefusedNamingTheUrl) {
  EventLoop loop;
  for (auto url : {"", "bogus://host:1", "registry:/x", "http://127.0.0.1:7700", "fixed",
                   "tcp://127.0.0.1:7700", "registry://h:1?ttl_ms=abc", "registry://h:1?ttl_ms=0",
                   "registry://h:1?ttl=5", "registry+unix:/tmp/r.sock?ttl_ms="}) {
    auto e = test::thrownBy([&]() { openResolver(loop, url); });
    EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << url << ": " << e.text;
    EXPECT_TRUE(e.mentions(url)) << e.text;
  }
  // The chosen resolver's own refusals.
  for (auto url : {"registry://", "registry+unix:", "fixed:job/ps-0", "fixed:bad name=127.0.0.1:1",
                   "file:/nonexistent/troupe-resolver.txt", "file:"}) {
    auto e = test::thrownBy([&]() { openResolver(loop, url); });
    EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << url << ": " << e.text;
  }
}

}  // namespace
}  // namespace troupe
