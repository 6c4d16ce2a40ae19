#pragma once
// openResolver: a Resolver from a URL, as JobContext::resolver and TROUPE_RESOLVER carry it.

#include <memory>

#include <kj/memory.h>
#include <kj/string.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/resolver.h"

namespace troupe {

// Opens the resolver `url` names, on `loop` (the resolver belongs to it; the caller owns it):
//
//   registry://HOST:PORT      a RegistryResolver (default options) over TCP; PORT defaults to 7700
//   registry+tls://HOST:PORT  the same over TLS, verified with the loop's credentials
//   registry+unix:PATH        a RegistryResolver over a unix socket
//
// A registry URL may end in "?ttl_ms=N" to ask for N-millisecond leases (RegistryResolverOptions
// ttl; default: the registry's, 10 s unless set): a replica that freezes leaves the registry that
// long after its last renewal.
//
//   etcd://HOST:PORT[,HOST:PORT...][/ROOT][?ttl_ms=N]
//                             an EtcdResolver on those etcd members (PORT defaults to 2379, ROOT
//                             to "troupe"; leases of N ms, rounded up to whole seconds)
//   etcds://HOST:PORT[,HOST:PORT...][/ROOT][?ttl_ms=N]
//                             the same over TLS, verified with the loop's credentials (which
//                             present their certificate, if any, to etcd)
//   etcd+unix:PATH[,PATH...][?root=ROOT&ttl_ms=N]
//                             the same over unix sockets
//
//   fixed:NAME=ADDR,...       FixedResolver::parse(the rest)
//   file:PATH                 FixedResolver::fromFile(PATH), read now
//
// `credentials` are what a registry or etcd resolver verifies its server with and presents (the
// resolver options' `credentials`); null for the loop's (loopCredentials(), net/credentials.h).
//
// Throws INVALID_ARGUMENT naming `url` for any other scheme, and whatever the chosen resolver's
// constructor or parser throws (INVALID_ARGUMENT for a malformed address, spec or file). Does not
// contact a registry yet.
kj::Own<Resolver> openResolver(EventLoop& loop, kj::StringPtr url,
                               std::shared_ptr<Credentials> credentials = nullptr);

}  // namespace troupe
