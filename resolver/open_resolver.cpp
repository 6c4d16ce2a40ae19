#include "troupe/resolver/open_resolver.h"

#include "troupe/base/errors.h"
#include "troupe/resolver/detail/url_query.h"
#include "troupe/resolver/etcd_resolver.h"
#include "troupe/resolver/fixed_resolver.h"
#include "troupe/resolver/registry_resolver.h"

namespace troupe {

namespace {

// Applies "?ttl_ms=N" (the only option a registry URL takes) to `options`.
void applyQuery(kj::StringPtr url, kj::StringPtr query, RegistryResolverOptions& options) {
  auto bad = [&](kj::StringPtr why) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("resolver URL '", printable(url), "': ", why));
  };
  if (!query.startsWith("ttl_ms=")) bad("the only option is ?ttl_ms=MILLISECONDS");
  options.ttl = resolver_detail::parseTtlMillis(query.slice(strlen("ttl_ms=")), bad);
}

}  // namespace

kj::Own<Resolver> openResolver(EventLoop& loop, kj::StringPtr url,
                               std::shared_ptr<Credentials> credentials) {
  if (url.startsWith("registry://") || url.startsWith("registry+tls://") ||
      url.startsWith("registry+unix:")) {
    RegistryResolverOptions options;
    options.credentials = kj::mv(credentials);
    KJ_IF_MAYBE(q, url.findFirst('?')) {
      applyQuery(url, url.slice(*q + 1), options);
      return kj::heap<RegistryResolver>(loop, kj::heapString(url.slice(0, *q)), options);
    }
    return kj::heap<RegistryResolver>(loop, url, options);
  }
  if (url.startsWith("etcd://") || url.startsWith("etcds://") || url.startsWith("etcd+unix:")) {
    auto options = EtcdResolver::parseUrl(url);
    if (credentials != nullptr) options.credentials = kj::mv(credentials);
    return kj::heap<EtcdResolver>(loop, kj::mv(options));
  }
  if (url.startsWith("fixed:")) return FixedResolver::parse(url.slice(strlen("fixed:")));
  if (url.startsWith("file:")) {
    auto path = url.slice(strlen("file:"));
    // Accept file:///abs/path as well as file:/abs/path and file:relative.
    if (path.startsWith("//")) path = path.slice(2);
    if (path.size() == 0) {
      throwError(ErrorCode::INVALID_ARGUMENT, kj::str("resolver URL '", url, "' names no file"));
    }
    return FixedResolver::fromFile(path);
  }
  throwError(
      ErrorCode::INVALID_ARGUMENT,
      kj::str("unknown resolver URL '", printable(url),
              "' (expected registry://HOST:PORT, registry+tls://HOST:PORT, registry+unix:PATH, "
              "etcd://HOST:PORT[,HOST:PORT...][/ROOT], etcds://..., etcd+unix:PATH, "
              "fixed:NAME=ADDRESS,... "
              "or file:PATH)"));
}

}  // namespace troupe
