#include "resolver/open_resolver.h"

#include "actor/errors.h"
#include "resolver/detail/registry_wire.h"
#include "resolver/fixed_resolver.h"
#include "resolver/registry_resolver.h"

namespace troupe {

kj::Own<Resolver> openResolver(EventLoop& loop, kj::StringPtr url) {
  if (url.startsWith("registry://") || url.startsWith("registry+unix:")) {
    return kj::heap<RegistryResolver>(loop, url);
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
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str("unknown resolver URL '", detail::printable(url),
                     "' (expected registry://HOST:PORT, registry+unix:PATH, fixed:NAME=ADDRESS,... "
                     "or file:PATH)"));
}

}  // namespace troupe
