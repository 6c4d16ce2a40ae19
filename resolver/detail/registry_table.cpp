#include "troupe/resolver/detail/registry_table.h"

#include <malloc.h>
#include <string.h>

#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/address.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/detail/job_list.h"
#include "troupe/resolver/registry_wire.h"

namespace troupe::resolver_detail {

size_t endpointBytes(const Endpoint& endpoint) {
  size_t total = endpoint.name.size() + endpoint.address.size();
  for (auto& [key, value] : endpoint.metadata) total += key.size() + value.size();
  return total;
}

namespace {

std::string_view view(kj::StringPtr s) { return std::string_view(s.begin(), s.size()); }

bool startsWith(const std::string& name, std::string_view prefix) {
  return std::string_view(name).substr(0, prefix.size()) == prefix;
}

// A rough upper bound of an event's size on the wire, for cutting batches.
size_t eventBytes(const WatchEvent& event) {
  return 128 + endpointBytes(event.endpoint) + event.endpoint.jobId.size() +
         event.endpoint.actor.size() + 16 * event.endpoint.metadata.size() +
         event.job.jobId.size() + event.job.reason.size();
}

int64_t millis(kj::Duration d) { return d / kj::MILLISECONDS; }

}  // namespace

RegistryTable::RegistryTable(EventLoop& loop, const RegistryServerOptions& options,
                             std::shared_ptr<spdlog::logger> log)
    : loop(loop),
      options(options),
      log(kj::mv(log)),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {}

RegistryTable::~RegistryTable() noexcept(false) {}

void RegistryTable::taskFailed(kj::Exception&& exception) {
  log->warn("registry task failed: {}", exception.getDescription().cStr());
}

void RegistryTable::checkRunning() const {
  if (!running) throwError(ErrorCode::DISCONNECTED, "the registry has stopped");
}

// ------------------------------------------------------------------------------------------------
// Entries and leases

RegistryTable::Granted RegistryTable::add(Endpoint endpoint, uint32_t ttlMillis,
                                          kj::ArrayPtr<const kj::byte> jobCredential) {
  checkRunning();
  checkRegistration(endpoint, jobCredential);

  kj::Duration ttl = ttlMillis == 0 ? options.defaultTtl : ttlMillis * kj::MILLISECONDS;
  if (ttl < options.minTtl) ttl = options.minTtl;
  if (ttl > options.maxTtl) ttl = options.maxTtl;
  uint64_t leaseId = nextLeaseId++;
  auto deadline = loop.timer().now() + ttl;
  endpoint.registeredAtMillis = (loop.calendarNow() - kj::UNIX_EPOCH) / kj::MILLISECONDS;

  auto it = entries.find(endpoint.name);
  auto event = WatchEvent::Type::ADDED;
  if (it != entries.end()) {
    auto& old = it->second;
    log->info("'{}' replaced by incarnation {} at {} (was incarnation {} at {}); the old lease is "
              "revoked",
              endpoint.name, endpoint.incarnation, endpoint.address, old.endpoint.incarnation,
              old.endpoint.address);
    leaseNames.erase(old.leaseId);
    deadlines.erase({old.deadline, old.leaseId});
    recordEvent(endpoint.jobId,
                kj::str(endpoint.name, " came back as incarnation ", endpoint.incarnation, " (was ",
                        old.endpoint.incarnation, ") at ", endpoint.address));
    old = Entry{kj::mv(endpoint), leaseId, ttl, deadline};
    event = WatchEvent::Type::CHANGED;
  } else {
    log->info("registered '{}' at {} (incarnation {}, {}, ttl {} ms)", endpoint.name,
              endpoint.address, endpoint.incarnation, toString(endpoint.state).cStr(), millis(ttl));
    recordEvent(endpoint.jobId,
                kj::str(endpoint.name, " registered at ", endpoint.address, " (incarnation ",
                        endpoint.incarnation, ", ", toString(endpoint.state), ")"));
    std::string name = endpoint.name;
    it = entries.emplace(kj::mv(name), Entry{kj::mv(endpoint), leaseId, ttl, deadline}).first;
  }
  leaseNames.emplace(leaseId, it->first);
  deadlines.emplace(deadline, leaseId);
  armTimer();
  notify(event, it->second.endpoint);
  ++registrations;  // once, whether it added an endpoint or replaced an incarnation
  return Granted{leaseId, ttl};
}

void RegistryTable::checkRegistration(Endpoint& endpoint,
                                      kj::ArrayPtr<const kj::byte> jobCredential) {
  auto refuse = [&](ErrorCode code, kj::StringPtr message) {
    log->warn("refused registration of '{}': {}", printable(endpoint.name).cStr(), message.cStr());
    throwError(code, message);
  };

  if (!fillNameParts(endpoint)) {
    refuse(ErrorCode::INVALID_ARGUMENT, errorMessage(endpointNameError(endpoint.name)));
  }
  size_t bytes = endpointBytes(endpoint);
  if (bytes > options.maxEndpointBytes) {
    refuse(ErrorCode::INVALID_ARGUMENT,
           kj::str("endpoint '", endpoint.name, "' is ", bytes,
                   " bytes (name, address and metadata); the registry's limit is ",
                   options.maxEndpointBytes));
  }
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                     [&]() { endpoint.address = Address::parse(endpoint.address).toString(); })) {
    refuse(ErrorCode::INVALID_ARGUMENT,
           kj::str("endpoint '", endpoint.name, "' has a bad address: ", errorMessage(*e)));
  }
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                authorize(endpoint.jobId, jobCredential, kj::str("register '", endpoint.name, "'"));
              })) {
    refuse(errorCode(*e), errorMessage(*e));
  }
  auto job = jobs.find(endpoint.jobId);
  if (job != jobs.end()) {
    KJ_IF_MAYBE(ended, job->second.ended) {
      refuse(ErrorCode::JOB_ENDED,
             kj::str("job '", endpoint.jobId, "' has ended (", printable(ended->reason),
                     "); its endpoints cannot register"));
    }
  }

  auto it = entries.find(endpoint.name);
  if (it != entries.end() && endpoint.incarnation <= it->second.endpoint.incarnation) {
    refuse(ErrorCode::NAME_TAKEN,
           kj::str("'", endpoint.name, "' is held by a live registration of incarnation ",
                   it->second.endpoint.incarnation, " at ", it->second.endpoint.address,
                   " (this one has incarnation ", endpoint.incarnation,
                   "); only a newer incarnation replaces it"));
  }
  if (it == entries.end() && entries.size() >= options.maxEndpoints) {
    refuse(ErrorCode::OVERLOADED,
           kj::str("the registry holds ", entries.size(), " endpoints, its limit (maxEndpoints)"));
  }
  // Last: it claims an unowned job for this registrant, which only a registration let in may do.
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                claimIfOpen(endpoint.jobId, jobCredential,
                            kj::str("register '", endpoint.name, "'"));
              })) {
    refuse(errorCode(*e), errorMessage(*e));
  }
}

RegistryTable::Entry& RegistryTable::leased(kj::StringPtr name, uint64_t leaseId,
                                            kj::StringPtr what) {
  checkRunning();
  auto it = entries.find(view(name));
  if (it == entries.end() || it->second.leaseId != leaseId) {
    throwError(ErrorCode::LEASE_LOST,
               kj::str("cannot ", what, " '", name, "': its lease is gone (expired, replaced by a ",
                       "newer incarnation, or its job ended); register again"));
  }
  return it->second;
}

kj::Duration RegistryTable::renew(kj::StringPtr name, uint64_t leaseId) {
  auto& entry = leased(name, leaseId, "renew");
  setDeadline(entry, loop.timer().now() + entry.ttl);
  return entry.ttl;
}

void RegistryTable::setState(kj::StringPtr name, uint64_t leaseId, EndpointState state) {
  auto& entry = leased(name, leaseId, "set the state of");
  if (entry.endpoint.state == state) return;
  log->info("'{}' is {}", entry.endpoint.name, toString(state).cStr());
  recordEvent(entry.endpoint.jobId, kj::str(entry.endpoint.name, " is ", toString(state)));
  entry.endpoint.state = state;
  notify(WatchEvent::Type::CHANGED, entry.endpoint);
}

void RegistryTable::release(kj::StringPtr name, uint64_t leaseId) {
  if (!running) return;
  auto it = entries.find(view(name));
  if (it == entries.end() || it->second.leaseId != leaseId) return;
  erase(it, "its lease was released");
}

void RegistryTable::setDeadline(Entry& entry, kj::TimePoint deadline) {
  deadlines.erase({entry.deadline, entry.leaseId});
  entry.deadline = deadline;
  deadlines.emplace(deadline, entry.leaseId);
  armTimer();
}

void RegistryTable::erase(std::map<std::string, Entry, std::less<>>::iterator it,
                          kj::StringPtr why) {
  auto& entry = it->second;
  leaseNames.erase(entry.leaseId);
  deadlines.erase({entry.deadline, entry.leaseId});
  Endpoint gone = kj::mv(entry.endpoint);
  entries.erase(it);
  log->info("removed '{}' at {} ({})", gone.name, gone.address, why.cStr());
  recordEvent(gone.jobId, kj::str(gone.name, " removed: ", why));
  notify(WatchEvent::Type::REMOVED, gone);
  ++erasedSinceTrim;
  trimLater();
}

void RegistryTable::trimLater() {
  // malloc keeps what entries freed for reuse; after many went (a job of thousands ended), or
  // the last one, hand it back to the system, at most once a second.
  if (trimQueued || (erasedSinceTrim < 1024 && !entries.empty())) return;
  trimQueued = true;
  tasks->add(loop.timer().afterDelay(1 * kj::SECONDS).then([this]() {
    trimQueued = false;
    log->debug("giving memory back after {} entries went", erasedSinceTrim);
    erasedSinceTrim = 0;
    malloc_trim(0);
  }));
}

void RegistryTable::armTimer() {
  if (deadlines.empty()) return;
  auto earliest = deadlines.begin()->first;
  KJ_IF_MAYBE(at, timerAt) {
    if (*at <= earliest) return;  // fires first and re-arms for the rest
  }
  timerAt = earliest;
  uint64_t generation = ++timerGeneration;
  tasks->add(loop.timer().atTime(earliest).then([this, generation]() {
    if (generation != timerGeneration) return;
    timerAt = nullptr;
    expire();
    armTimer();
  }));
}

void RegistryTable::expire() {
  auto now = loop.timer().now();
  while (!deadlines.empty() && deadlines.begin()->first <= now) {
    uint64_t leaseId = deadlines.begin()->second;
    auto name = leaseNames.find(leaseId);
    KJ_ASSERT(name != leaseNames.end());
    auto it = entries.find(name->second);
    KJ_ASSERT(it != entries.end());
    auto why = kj::str("expired: no renewal within its ttl of ", millis(it->second.ttl), " ms");
    ++expiredCount;
    erase(it, why);
  }
}

kj::Array<Endpoint> RegistryTable::resolve(kj::StringPtr prefix) {
  checkRunning();
  validatePrefix(prefix);
  kj::Vector<Endpoint> found;
  for (auto it = entries.lower_bound(view(prefix));
       it != entries.end() && startsWith(it->first, view(prefix)); ++it) {
    found.add(it->second.endpoint);
  }
  return found.releaseAsArray();
}

// ------------------------------------------------------------------------------------------------
// Watchers

uint64_t RegistryTable::addWatcher(kj::StringPtr prefix, schema::Watcher::Client client) {
  checkRunning();
  validatePrefix(prefix);
  if (watchers.size() >= options.maxWatchers) {
    log->warn("refused a watch on '{}': {} watchers, the limit (maxWatchers)", prefix.cStr(),
              watchers.size());
    throwError(ErrorCode::OVERLOADED,
               kj::str("the registry has ", watchers.size(), " watchers, its limit (maxWatchers)"));
  }
  uint64_t id = nextWatcherId++;
  auto& watcher =
      watchers
          .emplace(id,
                   Watcher{std::string(prefix.cStr(), prefix.size()), kj::mv(client), {}, false})
          .first->second;
  for (auto it = entries.lower_bound(view(prefix));
       it != entries.end() && startsWith(it->first, view(prefix)); ++it) {
    watcher.queue.push_back(WatchEvent{WatchEvent::Type::ADDED, it->second.endpoint, {}});
  }
  watcher.queue.push_back(WatchEvent{WatchEvent::Type::SYNCED, {}, {}});
  for (auto& e : watcher.queue) watcher.queuedBytes += eventBytes(e);
  queuedBytes += watcher.queuedBytes;
  log->debug("watcher {} on '{}' added", id, watcher.prefix);
  send(id, watcher);
  shedWatchers();
  return id;
}

void RegistryTable::removeWatcher(uint64_t id) {
  auto it = watchers.find(id);
  if (it == watchers.end()) return;
  queuedBytes -= it->second.queuedBytes + it->second.sendingBytes;
  watchers.erase(it);
  log->debug("watcher {} removed (its handle was released)", id);
}

void RegistryTable::notify(WatchEvent::Type type, const Endpoint& endpoint) {
  kj::Vector<uint64_t> ids;
  for (auto& [id, watcher] : watchers) {
    if (startsWith(endpoint.name, watcher.prefix)) ids.add(id);
  }
  for (auto id : ids) {
    auto it = watchers.find(id);
    if (it != watchers.end()) push(id, it->second, WatchEvent{type, endpoint, {}});
  }
}

void RegistryTable::push(uint64_t id, Watcher& watcher, WatchEvent event) {
  if (watcher.queue.size() >= options.maxQueuedEvents) {
    dropWatcher(id, kj::str("overloaded: it fell ", watcher.queue.size(),
                            " events behind (RegistryServerOptions::maxQueuedEvents)"));
    return;
  }
  size_t bytes = eventBytes(event);
  ++eventsPushed;
  watcher.queue.push_back(kj::mv(event));
  watcher.queuedBytes += bytes;
  queuedBytes += bytes;
  send(id, watcher);
  shedWatchers();
}

void RegistryTable::shedWatchers() {
  while (queuedBytes > options.maxQueuedEventBytes) {
    auto victim = watchers.end();
    for (auto it = watchers.begin(); it != watchers.end(); ++it) {
      auto held = it->second.queuedBytes + it->second.sendingBytes;
      if (victim == watchers.end() ||
          held > victim->second.queuedBytes + victim->second.sendingBytes) {
        victim = it;
      }
    }
    if (victim == watchers.end()) return;
    auto held = victim->second.queuedBytes + victim->second.sendingBytes;
    // One watcher alone is bounded by maxQueuedEvents; cutting it off would only make it
    // subscribe again for the same snapshot.
    if (held == queuedBytes) return;
    dropWatcher(victim->first, kj::str("overloaded: it is furthest behind, with ", held,
                                       " bytes of events "
                                       "queued, and watchers together had ",
                                       queuedBytes, " bytes, past ", options.maxQueuedEventBytes,
                                       " (RegistryServerOptions::maxQueuedEventBytes)"));
  }
}

void RegistryTable::send(uint64_t id, Watcher& watcher) {
  if (watcher.sending || watcher.queue.empty()) return;
  const size_t batchLimit = kj::min(options.maxMessageBytes / 4, size_t{4} << 20);
  size_t count = 0;
  size_t bytes = 0;
  while (count < watcher.queue.size()) {
    size_t more = eventBytes(watcher.queue[count]);
    if (count > 0 && bytes + more > batchLimit) break;
    bytes += more;
    ++count;
  }
  auto request = watcher.client.eventsRequest(
      capnp::MessageSize{bytes / sizeof(capnp::word) + 16, 0});
  auto list = request.initEvents(count);
  for (size_t i = 0; i < count; ++i) {
    toCapnp(watcher.queue.front(), list[i]);
    watcher.queue.pop_front();
  }
  watcher.sending = true;
  watcher.queuedBytes -= bytes;
  watcher.sendingBytes = bytes;
  tasks->add(request.send().then(
      [this, id](capnp::Response<schema::Watcher::EventsResults>&&) {
        auto it = watchers.find(id);
        if (it == watchers.end()) return;
        it->second.sending = false;
        queuedBytes -= it->second.sendingBytes;
        it->second.sendingBytes = 0;
        send(id, it->second);
      },
      [this, id](kj::Exception&& e) {
        if (watchers.count(id) == 0) return;
        // A watcher whose connection went is expected; one that throws is worth a warning.
        bool expected = errorCode(e) == ErrorCode::DISCONNECTED;
        dropWatcher(id, kj::str("its events() call failed: ", e.getDescription()), expected);
      }));
}

void RegistryTable::dropWatcher(uint64_t id, kj::StringPtr why, bool expected) {
  auto it = watchers.find(id);
  if (it == watchers.end()) return;
  log->log(expected ? spdlog::level::info : spdlog::level::warn, "dropped watcher {} on '{}': {}",
           id, it->second.prefix, why.cStr());
  queuedBytes -= it->second.queuedBytes + it->second.sendingBytes;
  if (!expected) ++watchersDropped;
  watchers.erase(it);
}

// ------------------------------------------------------------------------------------------------
// Jobs

JobStatus RegistryTable::jobStatus(kj::StringPtr jobId) {
  checkRunning();
  validateJobId(jobId);
  auto it = jobs.find(view(jobId));
  if (it != jobs.end()) {
    KJ_IF_MAYBE(status, it->second.ended) return *status;
  }
  return JobStatus{std::string(jobId.cStr(), jobId.size()), JobState::RUNNING, ""};
}

void RegistryTable::authorize(const std::string& jobId, kj::ArrayPtr<const kj::byte> presented,
                              kj::StringPtr what) {
  if (presented.size() > MAX_JOB_CREDENTIAL_BYTES) {
    log->warn("refused to let a client {}: its job credential is {} bytes", what.cStr(),
              presented.size());
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("cannot ", what, ": the job credential presented is ", presented.size(),
                       " bytes; at most ", MAX_JOB_CREDENTIAL_BYTES, " are accepted"));
  }
  auto it = jobs.find(jobId);
  if (it == jobs.end() || it->second.credential.empty()) return;  // an open job: anyone may
  auto expected = kj::StringPtr(it->second.credential).asBytes();
  if (!sameSecret(presented, expected)) {
    log->warn("refused to let a client {}: {} job credential", what.cStr(),
              presented.size() == 0 ? "no" : "a wrong");
    throwError(ErrorCode::PERMISSION_DENIED,
               kj::str("only the owner of job '", jobId, "' may ", what,
                       ", and the job credential ",
                       presented.size() == 0 ? "was not presented (TROUPE_JOB_TOKEN_FILE)"
                                             : "presented is not the job's"));
  }
}

RegistryTable::Job& RegistryTable::jobRecord(const std::string& jobId, kj::StringPtr what) {
  auto it = jobs.find(jobId);
  if (it != jobs.end()) return it->second;
  if (jobs.size() >= options.maxJobs) {
    if (endedOrder.empty()) {
      log->warn("refused to {}: the registry holds {} live jobs (maxJobs)", what.cStr(),
                jobs.size());
      throwError(ErrorCode::OVERLOADED,
                 kj::str("cannot ", what, ": the registry holds ", jobs.size(),
                         " live jobs, its limit (maxJobs); end some first"));
    }
    auto oldest = endedOrder.begin();
    log->info("forgot job '{}', which ended first, to remember job '{}' (maxJobs {})",
              oldest->second, jobId, options.maxJobs);
    jobs.erase(oldest->second);
    endedOrder.erase(oldest);
  }
  auto& job = jobs[jobId];
  job.createdAtMillis = nowMillis();
  return job;
}

int64_t RegistryTable::nowMillis() const {
  return (loop.calendarNow() - kj::UNIX_EPOCH) / kj::MILLISECONDS;
}

void RegistryTable::markEnded(const std::string& jobId, Job& job, JobStatus status) {
  if (job.ended != nullptr) endedOrder.erase(job.endedSeq);
  job.endedSeq = nextEndedSeq++;
  endedOrder.emplace(job.endedSeq, jobId);
  job.ended = kj::mv(status);
  job.endedAtMillis = nowMillis();
}

void RegistryTable::markRunning(Job& job) {
  if (job.ended == nullptr) return;
  endedOrder.erase(job.endedSeq);
  job.ended = nullptr;
  job.endedAtMillis = 0;
}

void RegistryTable::claimIfOpen(const std::string& jobId, kj::ArrayPtr<const kj::byte> presented,
                                kj::StringPtr what) {
  // A registry that restarted learns its jobs' owners again from their first registrations.
  if (presented.size() == 0) return;
  auto it = jobs.find(jobId);
  if (it != jobs.end() && !it->second.credential.empty()) return;
  jobRecord(jobId, what).credential = std::string(presented.asChars().begin(), presented.size());
  log->info("job '{}' is claimed by the credential of a client that could {}", jobId, what.cStr());
}

bool RegistryTable::hasEndpoints(kj::StringPtr jobId) const {
  for (auto& [name, entry] : entries) {
    if (entry.endpoint.jobId == view(jobId)) return true;
  }
  return false;
}

std::string RegistryTable::createJob(kj::StringPtr jobId, JobDescription description) {
  checkRunning();
  validateJobId(jobId);
  std::string id(jobId.cStr(), jobId.size());
  auto it = jobs.find(id);
  bool ended = it != jobs.end() && it->second.ended != nullptr;
  bool owned = it != jobs.end() && !it->second.credential.empty();
  // Live until its owner ends it: a launcher that went away (or reconnects) does not free the
  // name for another while its replicas may still come back with the credential.
  if (!ended && (owned || hasEndpoints(jobId))) {
    log->warn("refused to create job '{}': it is live", id);
    throwError(ErrorCode::JOB_ALREADY_EXISTS,
               kj::str("job '", jobId, "' already exists and is live (",
                       owned ? "created, and not ended by its owner" : "it has endpoints",
                       "): choose another name, or stop it first"));
  }
  auto& job = jobRecord(id, kj::str("create job '", jobId, "'"));
  if (job.ended != nullptr) log->info("job '{}' is created again", id);
  markRunning(job);
  job.credential = newJobCredential();
  job.control = nullptr;
  job.logLocation.clear();
  job.createdAtMillis = nowMillis();
  description.launcher = cutLauncherKind(description.launcher);
  job.description = kj::mv(description);
  log->info("job '{}' created", id);
  recordEvent(id, job.description.launcher.empty()
                      ? kj::str("created")
                      : kj::str("created by a ", job.description.launcher, " launcher, ",
                                job.description.replicas, " replica(s)"));
  return job.credential;
}

void RegistryTable::setControl(const std::string& jobId, kj::ArrayPtr<const kj::byte> presented,
                               schema::JobControl::Client control, std::string logLocation) {
  checkRunning();
  validateJobId(jobId);
  auto it = jobs.find(jobId);
  if (it == jobs.end() || it->second.credential.empty()) {
    throwError(ErrorCode::PERMISSION_DENIED,
               kj::str("cannot serve the control of job '", jobId,
                       "': only a job created with createJob has a launcher"));
  }
  authorize(jobId, presented, "serve its control");
  constexpr size_t MAX_LOG_LOCATION_BYTES = 1024;
  if (logLocation.size() > MAX_LOG_LOCATION_BYTES) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("a log location of ", logLocation.size(), " bytes; at most ",
                       MAX_LOG_LOCATION_BYTES, " are kept"));
  }
  it->second.control = kj::mv(control);
  it->second.logLocation = kj::mv(logLocation);
}

kj::String RegistryTable::noLauncher(const std::string& jobId, const Job& job) const {
  if (job.logLocation.empty()) {
    return kj::str("no launcher serves job '", jobId,
                   "' (its replicas were started by hand, or by a launcher that cannot be "
                   "reached through the registry)");
  }
  return kj::str("the launcher of job '", jobId, "' is gone; its logs are in ", job.logLocation);
}

schema::JobControl::Client RegistryTable::controlToStop(const std::string& jobId,
                                                        kj::ArrayPtr<const kj::byte> presented) {
  checkRunning();
  validateJobId(jobId);
  auto it = jobs.find(jobId);
  // Whether it ended anyone may know (listJobs says so); the rest needs the credential.
  if (it != jobs.end()) {
    KJ_IF_MAYBE(ended, it->second.ended) {
      throwError(ErrorCode::JOB_ENDED,
                 kj::str("job '", jobId, "' has already ended: ", ended->reason));
    }
  }
  bool admin = !options.adminToken.empty() &&
               sameSecret(presented, kj::StringPtr(options.adminToken).asBytes());
  bool owner = it != jobs.end() && !it->second.credential.empty() &&
               sameSecret(presented, kj::StringPtr(it->second.credential).asBytes());
  if (!admin && !owner) {
    log->warn("refused to stop job '{}': {} credential", jobId,
              presented.size() == 0 ? "no" : "a wrong");
    throwError(ErrorCode::PERMISSION_DENIED,
               kj::str("only the owner of job '", jobId,
                       "' (its job token) or an administrator (the registry's admin token) "
                       "may stop it, and the credential ",
                       presented.size() == 0 ? "was not presented" : "presented is neither"));
  }
  if (it == jobs.end()) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("the registry knows no job '", jobId, "'"));
  }
  KJ_IF_MAYBE(c, it->second.control) {
    log->info("job '{}': stopping it at the request of {}", jobId,
              admin ? "an administrator" : "its owner");
    return *c;
  }
  throwError(ErrorCode::UNREACHABLE, noLauncher(jobId, it->second));
}

schema::JobControl::Client RegistryTable::controlToRead(const std::string& jobId) {
  checkRunning();
  validateJobId(jobId);
  auto it = jobs.find(jobId);
  if (it == jobs.end()) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("the registry knows no job '", jobId,
                                                    "' (troupe jobs lists those it knows)"));
  }
  KJ_IF_MAYBE(c, it->second.control) {
    return *c;
  }
  throwError(ErrorCode::UNREACHABLE, noLauncher(jobId, it->second));
}

kj::String RegistryTable::controlLost(const std::string& jobId) {
  auto it = jobs.find(jobId);
  if (it == jobs.end()) return kj::str("the launcher of job '", jobId, "' is gone");
  it->second.control = nullptr;
  return noLauncher(jobId, it->second);
}

void RegistryTable::setJobStatus(JobStatus status, kj::ArrayPtr<const kj::byte> jobCredential) {
  checkRunning();
  kj::StringPtr jobId = status.jobId;
  validateJobId(jobId);
  authorize(status.jobId, jobCredential, "set its state");
  claimIfOpen(status.jobId, jobCredential, "set its state");
  if (status.state == JobState::RUNNING) {
    auto it = jobs.find(status.jobId);
    if (it != jobs.end() && it->second.ended != nullptr) {
      markRunning(it->second);
      if (it->second.credential.empty()) jobs.erase(it);
      log->info("job '{}' is running again; its endpoints may register", status.jobId);
      recordEvent(jobId, kj::str("running again"));
    }
    return;
  }
  status.reason = cutJobReason(status.reason);
  log->info("job '{}' ended ({}); removing its endpoints", status.jobId,
            printable(status.reason).cStr());
  markEnded(status.jobId, jobRecord(status.jobId, "end a job"), status);
  recordEvent(jobId, kj::str("ended: ", status.reason.empty() ? "no reason given" : status.reason));
  kj::Vector<std::string> doomed;
  for (auto& [name, entry] : entries) {
    if (entry.endpoint.jobId == status.jobId) doomed.add(name);
  }
  for (auto& name : doomed) {
    auto it = entries.find(name);
    if (it != entries.end()) erase(it, "its job ended");
  }
  kj::Vector<uint64_t> ids;
  for (auto& [id, watcher] : watchers) {
    if (jobOverlapsPrefix(jobId, watcher.prefix)) ids.add(id);
  }
  for (auto id : ids) {
    auto it = watchers.find(id);
    if (it != watchers.end())
      push(id, it->second, WatchEvent{WatchEvent::Type::JOB_ENDED, {}, status});
  }
}

void RegistryTable::shutdown() {
  if (!running) return;
  running = false;
  if (!entries.empty()) log->info("registry stopped; forgetting {} endpoints", entries.size());
  tasks = kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this));
  entries.clear();
  leaseNames.clear();
  deadlines.clear();
  timerAt = nullptr;
  watchers.clear();
  queuedBytes = 0;
  trimQueued = false;
  jobs.clear();
  endedOrder.clear();
  events = {};
  nextEvent = 0;
}

void RegistryTable::recordEvent(kj::StringPtr jobId, kj::String text) {
  if (events.capacity() == 0) events.reserve(MAX_JOB_EVENTS);
  EventRecord* r;
  if (events.size() < MAX_JOB_EVENTS) {
    r = &events.emplace_back();
  } else {
    r = &events[nextEvent];
    nextEvent = (nextEvent + 1) % MAX_JOB_EVENTS;
  }
  auto shown = printable(text);  // printable() cuts it to 160 bytes
  // A job id (at most MAX_NAME_LENGTH bytes) always fits whole; the text is cut to what is left.
  static_assert(sizeof(EventRecord::text) > MAX_NAME_LENGTH);
  size_t jobBytes = kj::min(jobId.size(), MAX_NAME_LENGTH);
  size_t textBytes = kj::min(shown.size(), sizeof(r->text) - jobBytes);
  memcpy(r->text, jobId.begin(), jobBytes);
  memcpy(r->text + jobBytes, shown.begin(), textBytes);
  r->atMillis = nowMillis();
  r->jobBytes = static_cast<uint16_t>(jobBytes);
  r->textBytes = static_cast<uint16_t>(textBytes);
}

std::vector<JobEvent> RegistryTable::jobEvents(kj::StringPtr jobId) const {
  std::vector<JobEvent> out;
  for (size_t i = 0; i < events.size(); ++i) {
    auto& r = events[(nextEvent + i) % events.size()];
    if (std::string_view(r.text, r.jobBytes) != view(jobId)) continue;
    out.push_back({std::string(r.text, r.jobBytes), r.atMillis,
                   std::string(r.text + r.jobBytes, r.textBytes)});
  }
  return out;
}

std::string RegistryTable::logLocation(kj::StringPtr jobId) const {
  auto it = jobs.find(view(jobId));
  return it == jobs.end() ? std::string() : it->second.logLocation;
}

}  // namespace troupe::resolver_detail

namespace troupe::resolver_detail {

JobInfo RegistryTable::recordInfo(const std::string& id, const Job& job) {
  JobInfo info;
  KJ_IF_MAYBE(status, job.ended) {
    info.status = *status;
  } else {
    info.status = JobStatus{id, JobState::RUNNING, ""};
  }
  info.launcher = job.description.launcher;
  info.replicas = job.description.replicas;
  info.createdAtMillis = job.createdAtMillis;
  info.endedAtMillis = job.endedAtMillis;
  return info;
}

kj::Array<JobInfo> RegistryTable::jobList() const {
  JobList list;
  for (auto& [id, job] : jobs) list.addRecord(recordInfo(id, job));
  for (auto& [name, entry] : entries) list.count(entry.endpoint);
  return list.finish();
}

kj::Maybe<JobInfo> RegistryTable::jobInfo(kj::StringPtr jobId) const {
  // As jobList() has it, from the job's record and its endpoints alone.
  JobList list;
  auto it = jobs.find(view(jobId));
  if (it != jobs.end()) list.addRecord(recordInfo(it->first, it->second));
  auto prefix = kj::str(jobId, "/");
  for (auto e = entries.lower_bound(view(prefix));
       e != entries.end() && startsWith(e->first, view(prefix)); ++e) {
    list.count(e->second.endpoint);
  }
  auto found = list.finish();
  if (found.size() == 0) return nullptr;
  return kj::mv(found[0]);
}

kj::Maybe<const Endpoint&> RegistryTable::find(kj::StringPtr name) const {
  auto it = entries.find(view(name));
  if (it == entries.end()) return nullptr;
  return it->second.endpoint;
}

void RegistryTable::collectMetrics(MetricsSnapshot& out) const {
  size_t byState[3] = {0, 0, 0};
  for (auto& [name, entry] : entries) ++byState[static_cast<size_t>(entry.endpoint.state)];
  for (auto state : {EndpointState::STARTING, EndpointState::READY, EndpointState::DRAINING}) {
    out.add("troupe_registry_endpoints", "Endpoints registered now, by state.", MetricType::GAUGE,
            {{"state", toString(state).cStr()}},
            static_cast<double>(byState[static_cast<size_t>(state)]));
  }
  auto gauge = [&](kj::StringPtr name, kj::StringPtr help, double value) {
    out.add(name, help, MetricType::GAUGE, {}, value);
  };
  auto counter = [&](kj::StringPtr name, kj::StringPtr help, uint64_t value) {
    out.add(name, help, MetricType::COUNTER, {}, static_cast<double>(value));
  };
  gauge("troupe_registry_leases", "Leases held now (one per endpoint).",
        static_cast<double>(leaseNames.size()));
  gauge("troupe_registry_watchers", "Watchers subscribed now.",
        static_cast<double>(watchers.size()));
  gauge("troupe_registry_queued_event_bytes", "Bytes of events queued for watchers now.",
        static_cast<double>(queuedBytes));
  size_t ended = endedOrder.size();
  gauge("troupe_registry_jobs_ended", "Ended jobs the registry remembers.",
        static_cast<double>(ended));
  counter("troupe_registry_registrations_total", "Registrations accepted.", registrations);
  counter("troupe_registry_leases_expired_total",
          "Entries removed because no renewal came in time.", expiredCount);
  counter("troupe_registry_events_pushed_total", "Watch events queued for watchers.", eventsPushed);
  counter("troupe_registry_watchers_dropped_total",
          "Watchers cut off for falling behind or failing.", watchersDropped);
  for (size_t c = 0; c < CallOutcomes::CODES; ++c) {
    if (refusals.errors[c] == 0) continue;
    out.add("troupe_registry_registrations_refused_total", "Registrations refused, by error code.",
            MetricType::COUNTER, {{"code", errorCodeName(static_cast<ErrorCode>(c)).cStr()}},
            static_cast<double>(refusals.errors[c]));
  }
}

}  // namespace troupe::resolver_detail
