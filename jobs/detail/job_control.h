#pragma once
// What a launcher serves for each job it created through its resolver: stopping it and reading
// its replicas' logs (Resolver::serveJobControl), for `troupe stop` and `troupe logs`.

#include <string>

#include <kj/async.h>

#include "troupe/jobs/launcher.h"
#include "troupe/resolver/resolver.h"

namespace troupe::jobs_detail {

// This machine's name ("localhost" when it has none).
std::string hostName();

// Offers `job`'s control through `resolver` (null when it cannot relay). The offer must not
// outlive `job`: the job holds it. `logDirectory` is the job's, named with this host in the
// offer's log location.
kj::Maybe<kj::Own<JobControlOffer>> offerJobControl(Resolver& resolver, Job& job,
                                                    std::string credential,
                                                    const std::string& logDirectory);

// Up to `maxBytes` of the file at `path` from byte `offset` (an empty piece, size 0, when it is
// missing), with `replicas` filled in. Throws FAILED naming the path for other errors.
LogPiece readLogPiece(const std::string& path, uint64_t offset, uint32_t maxBytes,
                      uint32_t replicas);

}  // namespace troupe::jobs_detail
