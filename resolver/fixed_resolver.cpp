#include "troupe/resolver/fixed_resolver.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <kj/debug.h>
#include <kj/io.h>
#include <kj/list.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"
#include "troupe/net/address.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/detail/job_list.h"
#include "troupe/resolver/detail/watch_queue.h"

namespace troupe {

namespace {

// A static table lives on no loop, so its job stamps come from the system clock.
int64_t wallClockMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using resolver_detail::FixedTable;

std::string_view view(kj::StringPtr s) { return std::string_view(s.begin(), s.size()); }

kj::String printable(std::string_view text) {
  return troupe::printable(kj::arrayPtr(text.data(), text.size()));
}

// Null when `endpoint.name` is an endpoint name, after filling in its parts; else why not.
kj::Maybe<kj::String> endpointNameProblem(Endpoint& endpoint) {
  if (fillNameParts(endpoint)) return nullptr;
  return kj::str(errorMessage(endpointNameError(endpoint.name)));
}

// The address in canonical form, or why it is not one.
struct ParsedAddress {
  std::string text;
  kj::Maybe<kj::String> problem;
};

ParsedAddress parseAddress(std::string_view text) {
  ParsedAddress result;
  auto copy = kj::heapString(text.data(), text.size());  // Address::parse wants a NUL at the end
  auto parse = [&]() { result.text = Address::parse(copy).toString(); };
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(parse)) {
    result.problem = kj::str(errorMessage(*e));
  }
  return result;
}

// One watch. Holds its queue of undelivered events; borrows the table until either goes.
class WatchImpl final : public Watch {
public:
  WatchImpl(FixedTable& table, kj::StringPtr prefix);
  ~WatchImpl() noexcept(false);
  KJ_DISALLOW_COPY(WatchImpl);

  kj::Promise<WatchEvent> next() override;

  bool matches(const std::string& name) const {
    return std::string_view(name).substr(0, prefix.size()) == prefix;
  }

  bool overlapsJob(kj::StringPtr jobId) const { return jobOverlapsPrefix(jobId, prefix); }

  // Hands `event` to the pending next(), or queues it.
  void push(WatchEvent event);

  // The table is going away: rejects a pending next() and leaves later ones to reject once the
  // queue is empty. The table unlinks this watch itself.
  void detach();

  kj::ListLink<WatchImpl> link;

private:
  kj::Maybe<FixedTable&> table;
  std::string prefix;
  resolver_detail::WatchQueue events;
};

// One registration. Borrows the table until either goes; owns the entry of its name only while
// the entry's `owner` points back at it.
class RegistrationImpl final : public Registration {
public:
  RegistrationImpl(FixedTable& table, std::string name);
  explicit RegistrationImpl(kj::Exception refusal) : refusal(kj::mv(refusal)) {}
  ~RegistrationImpl() noexcept(false);
  KJ_DISALLOW_COPY(RegistrationImpl);

  void setState(EndpointState state) override;
  kj::Promise<void> whenRegistered() override;

  // The table is going away; it unlinks this registration itself.
  void detach() { table = nullptr; }

  kj::ListLink<RegistrationImpl> link;

private:
  kj::Maybe<FixedTable&> table;
  std::string name;
  kj::Maybe<kj::Exception> refusal;
};

}  // namespace

namespace resolver_detail {

// The state behind a FixedResolver: the entries, and the watches and registrations that borrow
// it (linked here so they can be told when it goes, and unlinking themselves when they go first).
class FixedTable {
public:
  FixedTable() = default;
  KJ_DISALLOW_COPY(FixedTable);

  ~FixedTable() noexcept(false) {
    for (auto& w : watches) {
      watches.remove(w);
      w.detach();
    }
    for (auto& r : registrations) {
      registrations.remove(r);
      r.detach();
    }
  }

  // Stores `endpoint` (its name already validated) and notifies the watches.
  void put(Endpoint endpoint, kj::Maybe<RegistrationImpl&> owner) {
    auto it = entries.find(endpoint.name);
    if (it == entries.end()) {
      auto& entry = entries[endpoint.name];
      entry.endpoint = kj::mv(endpoint);
      entry.owner = owner;
      notify(WatchEvent::Type::ADDED, entry.endpoint);
      return;
    }
    auto& entry = it->second;
    entry.owner = owner;
    if (entry.endpoint == endpoint) return;
    entry.endpoint = kj::mv(endpoint);
    notify(WatchEvent::Type::CHANGED, entry.endpoint);
  }

  // Deletes the entry called `name` if it exists and, when `owner` is given, belongs to it.
  bool erase(std::string_view name, kj::Maybe<RegistrationImpl&> owner = nullptr) {
    auto it = entries.find(name);
    if (it == entries.end()) return false;
    if (owner != nullptr && !isOwner(it->second, owner)) return false;
    Endpoint gone = kj::mv(it->second.endpoint);
    entries.erase(it);
    notify(WatchEvent::Type::REMOVED, gone);
    return true;
  }

  // Sets the state of the entry `owner` still owns.
  void setState(std::string_view name, RegistrationImpl& owner, EndpointState state) {
    auto it = entries.find(name);
    if (it == entries.end() || !isOwner(it->second, owner)) return;
    auto& endpoint = it->second.endpoint;
    if (endpoint.state == state) return;
    endpoint.state = state;
    notify(WatchEvent::Type::CHANGED, endpoint);
  }

  // Whether an endpoint of job `jobId` is in the table.
  bool hasEndpoints(std::string_view jobId) const {
    for (auto& [name, entry] : entries) {
      if (entry.endpoint.jobId == jobId) return true;
    }
    return false;
  }

  // The job's status (RUNNING unless recorded otherwise).
  JobStatus jobStatus(std::string_view jobId) const {
    auto it = jobs.find(jobId);
    if (it != jobs.end()) return it->second;
    return JobStatus{std::string(jobId), JobState::RUNNING, ""};
  }

  // Lists the ended jobs (as `records`, those created here, say when they did not end) and
  // counts every entry for its job.
  kj::Array<JobInfo> jobList(const std::map<std::string, JobInfo>& records) const {
    resolver_detail::JobList list;
    for (auto& [id, info] : records) {
      auto copy = info;
      copy.status = jobStatus(id);
      if (copy.status.state == JobState::RUNNING) copy.endedAtMillis = 0;
      list.addRecord(kj::mv(copy));
    }
    for (auto& [id, status] : jobs) {
      if (records.count(id) == 0) list.addRecord(JobInfo{status});
    }
    for (auto& [name, entry] : entries) list.count(entry.endpoint);
    return list.finish();
  }

  // Records `status`; ending a job removes its entries, then tells the watches it overlaps.
  void setJobStatus(JobStatus status) {
    if (status.state == JobState::RUNNING) {
      jobs.erase(status.jobId);
      return;
    }
    status.reason = cutJobReason(status.reason);
    jobs[status.jobId] = status;
    kj::Vector<std::string> doomed;
    for (auto& [name, entry] : entries) {
      if (entry.endpoint.jobId == status.jobId) doomed.add(name);
    }
    for (auto& name : doomed) erase(name);
    kj::StringPtr jobId = status.jobId;
    for (auto& w : watches) {
      if (w.overlapsJob(jobId)) w.push(WatchEvent{WatchEvent::Type::JOB_ENDED, {}, status});
    }
  }

  // Calls `fn(endpoint)` for each entry under `prefix`, in name order.
  template <typename Fn>
  void forEachUnder(kj::StringPtr prefix, Fn&& fn) const {
    for (auto it = entries.lower_bound(view(prefix));
         it != entries.end() &&
         std::string_view(it->first).substr(0, prefix.size()) == view(prefix);
         ++it) {
      fn(it->second.endpoint);
    }
  }

  kj::List<WatchImpl, &WatchImpl::link> watches;
  kj::List<RegistrationImpl, &RegistrationImpl::link> registrations;

private:
  struct Entry {
    Endpoint endpoint;
    // The registration that published the entry and still owns it; null for add().
    kj::Maybe<RegistrationImpl&> owner;
  };

  static bool isOwner(const Entry& entry, kj::Maybe<RegistrationImpl&> owner) {
    KJ_IF_MAYBE(mine, entry.owner) {
      KJ_IF_MAYBE(o, owner) {
        return mine == o;
      }
    }
    return false;
  }

  void notify(WatchEvent::Type type, const Endpoint& endpoint) {
    for (auto& w : watches) {
      if (w.matches(endpoint.name)) w.push(WatchEvent{type, endpoint, {}});
    }
  }

  std::map<std::string, Entry, std::less<>> entries;
  std::map<std::string, JobStatus, std::less<>> jobs;  // jobs not RUNNING
};

}  // namespace resolver_detail

// ------------------------------------------------------------------------------------------------

namespace {

WatchImpl::WatchImpl(FixedTable& table, kj::StringPtr prefix)
    : table(table), prefix(prefix.begin(), prefix.size()) {
  table.forEachUnder(prefix, [this](const Endpoint& endpoint) {
    events.push(WatchEvent{WatchEvent::Type::ADDED, endpoint, {}});
  });
  events.push(WatchEvent{WatchEvent::Type::SYNCED, Endpoint{}, {}});
  table.watches.add(*this);
}

WatchImpl::~WatchImpl() noexcept(false) {
  KJ_IF_MAYBE(t, table) {
    t->watches.remove(*this);
  }
}

kj::Promise<WatchEvent> WatchImpl::next() { return events.next(); }

void WatchImpl::push(WatchEvent event) { events.push(kj::mv(event)); }

void WatchImpl::detach() {
  table = nullptr;
  events.end(
      makeError(ErrorCode::DISCONNECTED, "the FixedResolver behind this watch was destroyed"));
}

RegistrationImpl::RegistrationImpl(FixedTable& table, std::string name)
    : table(table), name(kj::mv(name)) {
  table.registrations.add(*this);
}

RegistrationImpl::~RegistrationImpl() noexcept(false) {
  KJ_IF_MAYBE(t, table) {
    t->registrations.remove(*this);
    t->erase(name, *this);
  }
}

void RegistrationImpl::setState(EndpointState state) {
  KJ_IF_MAYBE(t, table) {
    t->setState(name, *this, state);
  }
}

kj::Promise<void> RegistrationImpl::whenRegistered() {
  KJ_IF_MAYBE(e, refusal) {
    return kj::cp(*e);
  }
  return kj::READY_NOW;
}

// Splits `text` at each of `separators`, dropping empty pieces when `skipEmpty`.
std::vector<std::string_view> split(std::string_view text, std::string_view separators,
                                    bool skipEmpty) {
  std::vector<std::string_view> pieces;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && separators.find(text[i]) == std::string_view::npos) continue;
    if (i > start || !skipEmpty) pieces.push_back(text.substr(start, i - start));
    start = i + 1;
  }
  return pieces;
}

std::string_view trim(std::string_view text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t") + 1 - begin);
}

kj::Maybe<EndpointState> parseState(std::string_view text) {
  for (auto state : {EndpointState::STARTING, EndpointState::READY, EndpointState::DRAINING}) {
    if (text == view(toString(state))) return state;
  }
  return nullptr;
}

}  // namespace

// ------------------------------------------------------------------------------------------------

FixedResolver::FixedResolver() : table(kj::heap<FixedTable>()) {}

FixedResolver::FixedResolver(kj::ArrayPtr<const Endpoint> endpoints) : FixedResolver() {
  for (auto& endpoint : endpoints) add(endpoint);
}

FixedResolver::~FixedResolver() noexcept(false) {}

kj::Own<FixedResolver> FixedResolver::parse(kj::StringPtr spec) {
  auto resolver = kj::heap<FixedResolver>();
  if (trim(view(spec)).empty()) return resolver;
  std::map<std::string, size_t, std::less<>> seen;
  auto entries = split(view(spec), ",", false);
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string_view text = trim(entries[i]);
    auto fail = [&](kj::StringPtr reason) {
      throwError(ErrorCode::INVALID_ARGUMENT, kj::str("fixed resolver spec, entry ", i + 1, " '",
                                                      printable(text), "': ", reason));
    };
    if (text.empty()) fail("empty entry");
    size_t eq = text.find('=');
    if (eq == std::string_view::npos) fail("expected NAME=ADDRESS");
    Endpoint endpoint;
    endpoint.name = std::string(trim(text.substr(0, eq)));
    KJ_IF_MAYBE(problem, endpointNameProblem(endpoint)) {
      fail(*problem);
    }
    auto address = parseAddress(trim(text.substr(eq + 1)));
    KJ_IF_MAYBE(problem, address.problem) {
      fail(*problem);
    }
    auto [previous, added] = seen.emplace(endpoint.name, i + 1);
    if (!added) fail(kj::str("name already given in entry ", previous->second));
    endpoint.address = kj::mv(address.text);
    endpoint.state = EndpointState::READY;
    resolver->table->put(kj::mv(endpoint), nullptr);
  }
  return resolver;
}

kj::Own<FixedResolver> FixedResolver::parseFile(kj::StringPtr text, kj::StringPtr sourceName) {
  auto resolver = kj::heap<FixedResolver>();
  std::map<std::string, size_t, std::less<>> seen;
  auto lines = split(view(text), "\n", false);
  for (size_t n = 0; n < lines.size(); ++n) {
    auto fail = [&](kj::StringPtr reason) {
      throwError(ErrorCode::INVALID_ARGUMENT, kj::str(sourceName, ':', n + 1, ": ", reason));
    };
    std::string_view line = lines[n].substr(0, lines[n].find('#'));
    auto fields = split(line, " \t\r", true);
    if (fields.size() == 0) continue;
    if (fields.size() < 2) fail("expected NAME ADDRESS [STATE] [KEY=VALUE ...]");

    Endpoint endpoint;
    endpoint.name = std::string(fields[0]);
    KJ_IF_MAYBE(problem, endpointNameProblem(endpoint)) {
      fail(*problem);
    }
    auto address = parseAddress(fields[1]);
    KJ_IF_MAYBE(problem, address.problem) {
      fail(*problem);
    }
    endpoint.address = kj::mv(address.text);
    endpoint.state = EndpointState::READY;

    for (size_t f = 2; f < fields.size(); ++f) {
      std::string_view field = fields[f];
      size_t eq = field.find('=');
      if (eq != std::string_view::npos) {
        if (eq == 0) fail(kj::str("empty key in '", printable(field), "'"));
        auto [it, added] = endpoint.metadata.emplace(field.substr(0, eq), field.substr(eq + 1));
        if (!added) fail(kj::str("key '", printable(it->first), "' given twice"));
      } else if (f == 2) {
        KJ_IF_MAYBE(state, parseState(field)) {
          endpoint.state = *state;
        } else {
          fail(kj::str("unknown state '", printable(field),
                       "' (expected starting, ready or draining)"));
        }
      } else {
        fail(kj::str("expected KEY=VALUE, got '", printable(field), "'"));
      }
    }

    auto [previous, added] = seen.emplace(endpoint.name, n + 1);
    if (!added) {
      fail(kj::str("endpoint '", printable(fields[0]), "' already given on line ",
                   previous->second));
    }
    resolver->table->put(kj::mv(endpoint), nullptr);
  }
  return resolver;
}

kj::Own<FixedResolver> FixedResolver::fromFile(kj::StringPtr path) {
  auto cannotRead = [&](int error) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("cannot read fixed resolver file '",
                                                    printable(view(path)), "': ", strerror(error)));
  };
  int fd;
  do {
    fd = ::open(path.cStr(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) cannotRead(errno);
  kj::AutoCloseFd file(fd);

  kj::Vector<char> contents;
  char buffer[8192];
  for (;;) {
    ssize_t n = ::read(file.get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      cannotRead(errno);
    }
    if (n == 0) break;
    contents.addAll(buffer, buffer + n);
  }
  auto text = kj::heapString(contents.begin(), contents.size());
  return parseFile(text, path);
}

namespace {

kj::Maybe<kj::Exception> jobEndedError(const JobStatus& job) {
  if (job.state != JobState::ENDED) return nullptr;
  return makeError(ErrorCode::JOB_ENDED, kj::str("job '", job.jobId, "' has ended (", job.reason,
                                                 "); its endpoints cannot register"));
}

}  // namespace

void FixedResolver::add(Endpoint endpoint) {
  KJ_IF_MAYBE(problem, endpointNameProblem(endpoint)) {
    throwError(ErrorCode::INVALID_ARGUMENT, *problem);
  }
  KJ_IF_MAYBE(e, jobEndedError(table->jobStatus(endpoint.jobId))) {
    kj::throwFatalException(kj::mv(*e));
  }
  table->put(kj::mv(endpoint), nullptr);
}

bool FixedResolver::remove(kj::StringPtr name) { return table->erase(view(name)); }

kj::Promise<kj::Array<Endpoint>> FixedResolver::resolve(kj::StringPtr prefix) {
  validatePrefix(prefix);
  kj::Vector<Endpoint> found;
  table->forEachUnder(prefix, [&](const Endpoint& endpoint) { found.add(endpoint); });
  return found.releaseAsArray();
}

kj::Own<Watch> FixedResolver::watch(kj::StringPtr prefix) {
  validatePrefix(prefix);
  return kj::heap<WatchImpl>(*table, prefix);
}

kj::Own<Registration> FixedResolver::registerEndpoint(Endpoint endpoint) {
  KJ_IF_MAYBE(problem, endpointNameProblem(endpoint)) {
    return kj::heap<RegistrationImpl>(makeError(ErrorCode::INVALID_ARGUMENT, *problem));
  }
  KJ_IF_MAYBE(e, jobEndedError(table->jobStatus(endpoint.jobId))) {
    return kj::heap<RegistrationImpl>(kj::mv(*e));
  }
  auto registration = kj::heap<RegistrationImpl>(*table, endpoint.name);
  table->put(kj::mv(endpoint), *registration);
  return registration;
}

kj::Promise<JobStatus> FixedResolver::jobStatus(kj::StringPtr jobId) {
  validateJobId(jobId);
  return table->jobStatus(view(jobId));
}

kj::Promise<void> FixedResolver::setJobStatus(JobStatus status, std::string jobCredential) {
  validateJobId(status.jobId);
  return kj::evalNow([&]() {
    auto it = created.find(status.jobId);
    if (it != created.end() &&
        !sameSecret(kj::StringPtr(jobCredential).asBytes(), kj::StringPtr(it->second).asBytes())) {
      throwError(ErrorCode::PERMISSION_DENIED,
                 kj::str("only the owner of job '", status.jobId,
                         "' may set its state, and the job credential presented is not the "
                         "job's"));
    }
    auto record = records.find(status.jobId);
    if (record != records.end()) {
      record->second.endedAtMillis = status.state == JobState::ENDED ? wallClockMillis() : 0;
    }
    table->setJobStatus(kj::mv(status));
    return kj::Promise<void>(kj::READY_NOW);
  });
}

kj::Promise<std::string> FixedResolver::createJob(kj::StringPtr jobId, JobDescription description) {
  validateJobId(jobId);
  return kj::evalNow([&]() {
    std::string id(jobId.cStr());
    bool running = table->jobStatus(view(jobId)).state == JobState::RUNNING;
    if (running && (created.count(id) > 0 || table->hasEndpoints(view(jobId)))) {
      throwError(ErrorCode::JOB_ALREADY_EXISTS,
                 kj::str("job '", jobId,
                         "' already exists and is live: choose another name, or "
                         "stop it first"));
    }
    auto credential = newJobCredential();
    created[id] = credential;
    JobInfo record;
    record.status = JobStatus{id, JobState::RUNNING, ""};
    record.launcher = cutLauncherKind(description.launcher);
    record.replicas = description.replicas;
    record.createdAtMillis = wallClockMillis();
    records[id] = kj::mv(record);
    table->setJobStatus(JobStatus{id, JobState::RUNNING, ""});
    return kj::Promise<std::string>(kj::mv(credential));
  });
}

kj::Promise<kj::Array<JobInfo>> FixedResolver::jobs() { return table->jobList(records); }

}  // namespace troupe
