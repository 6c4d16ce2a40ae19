#include "troupe/net/credentials.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <kj/compat/tls.h>
#include <kj/debug.h>
#include <kj/encoding.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"

namespace troupe {

namespace {

[[noreturn]] void badFile(kj::StringPtr what, kj::StringPtr path, kj::StringPtr why) {
  throwError(ErrorCode::INVALID_ARGUMENT, kj::str("cannot use ", what, " '", path, "': ", why));
}

// The whole of the file at `path`, read straight into one buffer (no copies left behind in
// freed memory); `what` names it in errors ("the TLS key"). With `secret`, refuses a file that
// other users may read or that is not a plain file.
kj::String readWholeFile(kj::StringPtr what, kj::StringPtr path, bool secret = false) {
  int fd = ::open(path.cStr(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) badFile(what, path, strerror(errno));
  KJ_DEFER(::close(fd));
  struct stat st;
  if (::fstat(fd, &st) != 0) badFile(what, path, strerror(errno));
  if (!S_ISREG(st.st_mode)) badFile(what, path, "not a regular file");
  if (secret && (st.st_mode & 077) != 0) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    badFile(what, path,
            kj::str("other users may read it (mode ", mode,
                    "); make it readable by its owner only: chmod 600"));
  }
  constexpr off_t LIMIT = 1024 * 1024;
  if (st.st_size > LIMIT) badFile(what, path, "larger than 1 MiB");
  auto text = kj::heapArray<char>(static_cast<size_t>(st.st_size) + 1);
  size_t done = 0;
  while (done + 1 < text.size()) {
    ssize_t n = ::read(fd, text.begin() + done, text.size() - 1 - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) badFile(what, path, strerror(errno));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  text[done] = '\0';
  if (done + 1 < text.size()) {
    // Shorter than fstat said (it changed meanwhile): keep what was read.
    auto shorter = kj::heapArray<char>(text.begin(), done + 1);
    OPENSSL_cleanse(text.begin(), text.size());
    text = kj::mv(shorter);
  }
  return kj::String(kj::mv(text));
}

// Runs `parse` on the contents of a PEM file, turning the OpenSSL error kj throws into one that
// names the file (never the contents). A `secret` file (a key) must be its owner's alone, and
// its contents are wiped once parsed.
template <typename T, typename Parse>
T parsePem(kj::StringPtr what, kj::StringPtr path, Parse&& parse, bool secret = false) {
  auto text = readWholeFile(what, path, secret);
  KJ_DEFER(OPENSSL_cleanse(text.begin(), text.size()));
  kj::Maybe<T> result;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { result = parse(text); })) {
    (void)e;  // OpenSSL's reason may quote the input; keep it out of the message
    badFile(what, path, "not a PEM file of the expected kind");
  }
  return kj::mv(KJ_ASSERT_NONNULL(result));
}

// Whether the (parsed, so valid) PEM files hold a certificate and its private key. OpenSSL
// would otherwise drop a mismatched key without a word and fail every handshake later.
bool keyMatchesCertificate(kj::StringPtr certFile, kj::StringPtr keyFile) {
  auto certText = readWholeFile("the TLS certificate", certFile);
  auto keyText = readWholeFile("the TLS key", keyFile, true);
  KJ_DEFER(OPENSSL_cleanse(keyText.begin(), keyText.size()));
  BIO* certBio = BIO_new_mem_buf(certText.begin(), certText.size());
  BIO* keyBio = BIO_new_mem_buf(keyText.begin(), keyText.size());
  KJ_DEFER({
    BIO_free(certBio);
    BIO_free(keyBio);
  });
  X509* cert = PEM_read_bio_X509(certBio, nullptr, nullptr, nullptr);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(keyBio, nullptr, nullptr, nullptr);
  bool matches = cert != nullptr && key != nullptr && X509_check_private_key(cert, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  return matches;
}

// Reads the secret in `file` (when named) into `secret`, which must be empty then.
void readSecretFile(kj::StringPtr what, const std::string& file, std::string& secret) {
  if (file.empty()) return;
  if (!secret.empty()) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("both ", what, " and its content are set: set one"));
  }
  auto text = readWholeFile(what, file, true);
  KJ_DEFER(OPENSSL_cleanse(text.begin(), text.size()));
  size_t size = text.size();
  if (memchr(text.begin(), '\0', size) != nullptr) {
    badFile(what, file, "it holds a NUL byte; write the secret as text (openssl rand -hex 32)");
  }
  while (size > 0 && (text[size - 1] == '\n' || text[size - 1] == '\r')) --size;
  if (size == 0) badFile(what, file, "it is empty");
  secret.assign(text.begin(), size);
}

kj::Own<kj::TlsContext> makeContext(const TlsOptions& tls, bool server,
                                    kj::ArrayPtr<const kj::TlsCertificate> trusted,
                                    kj::Maybe<const kj::TlsKeypair&> keypair) {
  kj::TlsContext::Options o;
  o.useSystemTrustStore = tls.caFile.empty();
  o.trustedCertificates = trusted;
  o.minVersion = kj::TlsVersion::TLS_1_2;
  o.defaultKeypair = keypair;
  o.verifyClients = server && tls.requireClientCertificates;
  return kj::heap<kj::TlsContext>(kj::mv(o));
}

kj::Exception handshakeFailed(kj::StringPtr whom, kj::Exception&& e) {
  auto description = e.getDescription();
  auto mentions = [&](const char* text) { return strstr(description.cStr(), text) != nullptr; };
  kj::StringPtr hint;
  if (mentions("peer disconnected") || mentions("wrong version") ||
      mentions("packet length too long") || mentions("unexpected eof") ||
      mentions("record layer failure")) {
    hint = " (does the peer speak TLS?)";
  }
  return makeError(ErrorCode::DISCONNECTED,
                   kj::str("TLS handshake with ", whom, " failed: ", description, hint));
}

kj::Promise<kj::Own<kj::AsyncIoStream>> bounded(kj::Timer& timer, kj::Duration limit,
                                                kj::String whom,
                                                kj::Promise<kj::Own<kj::AsyncIoStream>> handshake) {
  auto timeout = timer.afterDelay(limit).then([limit]() -> kj::Own<kj::AsyncIoStream> {
    kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, kj::str("no handshake within ",
                                                               limit / kj::MILLISECONDS, " ms")));
  });
  return handshake.exclusiveJoin(kj::mv(timeout))
      .catch_([whom = kj::mv(whom)](kj::Exception&& e) -> kj::Own<kj::AsyncIoStream> {
        kj::throwFatalException(handshakeFailed(whom, kj::mv(e)));
      });
}

}  // namespace

Credentials::Credentials(CredentialsOptions o) : options(kj::mv(o)) {
  readSecretFile("the token file", options.tokenFile, options.token);
  readSecretFile("the job token file", options.jobTokenFile, options.jobToken);
  KJ_IF_MAYBE(tls, options.tls) {
    kj::Vector<kj::TlsCertificate> trusted;
    if (!tls->caFile.empty()) {
      // A bundle may hold several CAs: each PEM block is one.
      auto text = readWholeFile("the TLS CA bundle", tls->caFile);
      kj::StringPtr rest = text;
      static constexpr kj::StringPtr BEGIN = "-----BEGIN CERTIFICATE-----"_kj;
      static constexpr kj::StringPtr END = "-----END CERTIFICATE-----"_kj;
      for (;;) {
        auto begin = strstr(rest.cStr(), BEGIN.cStr());
        if (begin == nullptr) break;
        auto end = strstr(begin, END.cStr());
        if (end == nullptr) break;
        auto block = kj::str(kj::arrayPtr(begin, end + END.size()));
        KJ_IF_MAYBE(e,
                    kj::runCatchingExceptions([&]() { trusted.add(kj::TlsCertificate(block)); })) {
          (void)e;
          badFile("the TLS CA bundle", tls->caFile, "holds a certificate that does not parse");
        }
        rest = kj::StringPtr(end + END.size());
      }
      if (trusted.empty()) badFile("the TLS CA bundle", tls->caFile, "holds no PEM certificate");
    }
    if (tls->certFile.empty() != tls->keyFile.empty()) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 "a TLS certificate needs its key and a key its certificate: set both or neither");
    }
    if (tls->requireClientCertificates && tls->caFile.empty()) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 "requiring client certificates needs a CA bundle to check them against");
    }
    kj::Maybe<kj::TlsKeypair> keypair;
    if (!tls->certFile.empty()) {
      auto certificate = parsePem<kj::TlsCertificate>("the TLS certificate", tls->certFile,
                                                      [](kj::StringPtr text) {
                                                        return kj::TlsCertificate(text);
                                                      });
      auto key = parsePem<kj::TlsPrivateKey>(
          "the TLS key", tls->keyFile, [](kj::StringPtr text) { return kj::TlsPrivateKey(text); },
          true);
      keypair = kj::TlsKeypair{kj::mv(key), kj::mv(certificate)};
    }
    if (!tls->certFile.empty() && !keyMatchesCertificate(tls->certFile, tls->keyFile)) {
      badFile("the TLS key", tls->keyFile, "does not belong to the certificate");
    }
    trustedCertificates = trusted.releaseAsArray();
    keypair_ = kj::mv(keypair);
    KJ_IF_MAYBE(kp, keypair_) {
      KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                    serverTls = makeContext(*tls, true, trustedCertificates, *kp);
                  })) {
        (void)e;
        badFile("the TLS key", tls->keyFile, "does not belong to the certificate");
      }
    }
    clientTls = makeContext(*tls, false, trustedCertificates, keypair_);
  } else {
    clientTls = makeContext(TlsOptions{}, false, nullptr, nullptr);
  }
}

Credentials::~Credentials() noexcept(false) {
  // Leave no copy of the tokens in freed memory.
  OPENSSL_cleanse(options.token.data(), options.token.size());
  OPENSSL_cleanse(options.jobToken.data(), options.jobToken.size());
}

std::shared_ptr<Credentials> Credentials::fromEnvironment() {
  return std::make_shared<Credentials>(optionsFromEnvironment());
}

CredentialsOptions Credentials::optionsFromEnvironment() {
  auto get = [](const char* name) -> std::string {
    const char* value = ::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
  };
  CredentialsOptions o;
  TlsOptions tls;
  tls.caFile = get("TROUPE_TLS_CA");
  tls.certFile = get("TROUPE_TLS_CERT");
  tls.keyFile = get("TROUPE_TLS_KEY");
  tls.serverName = get("TROUPE_TLS_SERVER_NAME");
  auto require = get("TROUPE_TLS_REQUIRE_CLIENT_CERT");
  if (!require.empty() && require != "0" && require != "1") {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("TROUPE_TLS_REQUIRE_CLIENT_CERT must be 0 or 1, not '", require, "'"));
  }
  tls.requireClientCertificates = require == "1";
  if (!tls.caFile.empty() || !tls.certFile.empty() || !tls.keyFile.empty() ||
      !tls.serverName.empty() || tls.requireClientCertificates) {
    o.tls = kj::mv(tls);
  }

  auto tokenFile = get("TROUPE_TOKEN_FILE");
  const char* token = ::getenv("TROUPE_TOKEN");
  if (!tokenFile.empty() && token != nullptr && *token != '\0') {
    throwError(ErrorCode::INVALID_ARGUMENT,
               "both TROUPE_TOKEN_FILE and TROUPE_TOKEN are set: set one");
  }
  if (!tokenFile.empty()) {
    o.tokenFile = kj::mv(tokenFile);
  } else if (token != nullptr) {
    o.token = token;
  }
  o.jobTokenFile = get("TROUPE_JOB_TOKEN_FILE");
  if (!o.jobTokenFile.empty()) o.jobId = get("TROUPE_JOB_ID");
  return o;
}

std::shared_ptr<Credentials> Credentials::none() {
  return std::make_shared<Credentials>(CredentialsOptions{});
}

bool Credentials::canServeTls() const { return serverTls.get() != nullptr; }

bool Credentials::requiresClientCertificates() const {
  KJ_IF_MAYBE(tls, options.tls) {
    return tls->requireClientCertificates && canServeTls();
  }
  return false;
}

kj::ArrayPtr<const kj::byte> Credentials::token() const {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(options.token.data()),
                      options.token.size());
}

bool sameSecret(kj::ArrayPtr<const kj::byte> a, kj::ArrayPtr<const kj::byte> b) {
  kj::byte da[SHA256_DIGEST_LENGTH];
  kj::byte db[SHA256_DIGEST_LENGTH];
  SHA256(a.begin(), a.size(), da);
  SHA256(b.begin(), b.size(), db);
  return CRYPTO_memcmp(da, db, sizeof(da)) == 0;
}

std::string readSecret(kj::StringPtr what, const std::string& file) {
  std::string secret;
  readSecretFile(what, file, secret);
  return secret;
}

std::string newJobCredential() {
  kj::byte random[32];
  KJ_ASSERT(RAND_bytes(random, sizeof(random)) == 1, "no random bytes for a job credential");
  KJ_DEFER(OPENSSL_cleanse(random, sizeof(random)));
  auto hex = kj::encodeHex(kj::arrayPtr(random, sizeof(random)));
  KJ_DEFER(OPENSSL_cleanse(hex.begin(), hex.size()));
  return std::string(hex.begin(), hex.size());
}

bool Credentials::tokenMatches(kj::ArrayPtr<const kj::byte> presented) const {
  return !options.token.empty() && sameSecret(presented, token());
}

kj::ArrayPtr<const kj::byte> Credentials::jobTokenFor(kj::StringPtr jobId) const {
  if (options.jobToken.empty() || options.jobId.empty() || jobId != options.jobId) return nullptr;
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(options.jobToken.data()),
                      options.jobToken.size());
}

bool Credentials::jobTokenMatches(kj::ArrayPtr<const kj::byte> presented) const {
  return !options.jobToken.empty() &&
         sameSecret(presented, kj::StringPtr(options.jobToken).asBytes());
}

kj::Promise<kj::Own<kj::AsyncIoStream>> Credentials::wrapServer(kj::Timer& timer,
                                                                kj::Own<kj::AsyncIoStream> stream,
                                                                kj::Maybe<kj::TimePoint> deadline) {
  KJ_REQUIRE(canServeTls(), "no TLS certificate to serve with");
  auto limit = KJ_ASSERT_NONNULL(options.tls).handshakeTimeout;
  KJ_IF_MAYBE(d, deadline) {
    limit = *d > timer.now() ? *d - timer.now() : 0 * kj::NANOSECONDS;
  }
  return bounded(timer, limit, kj::str("a client"), serverTls->wrapServer(kj::mv(stream)));
}

kj::Promise<kj::Own<kj::AsyncIoStream>> Credentials::wrapClient(kj::Timer& timer,
                                                                kj::Own<kj::AsyncIoStream> stream,
                                                                const Address& address) {
  kj::StringPtr name = address.host;
  kj::Duration limit = TlsOptions{}.handshakeTimeout;
  KJ_IF_MAYBE(tls, options.tls) {
    if (!tls->serverName.empty()) name = tls->serverName;
    limit = tls->handshakeTimeout;
  }
  return bounded(timer, limit, kj::str(address.toString()),
                 clientTls->wrapClient(kj::mv(stream), name));
}

bool reachableFromOtherMachines(const Address& address) {
  if (!address.isInet()) return false;
  auto& h = address.host;
  if (h == "localhost" || h == "::1") return false;
  struct in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) != 127;
  return true;
}

void refuseOpenListener(const Address& address, const Credentials& credentials,
                        kj::StringPtr override) {
  if (!reachableFromOtherMachines(address) || credentials.authenticatesClients(address)) return;
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str("refusing to listen on ", address.toString(),
                     " without credentials: anyone who can reach it could call every actor and "
                     "change every job. Set a cluster token (TROUPE_TOKEN_FILE) or require "
                     "client certificates (TROUPE_TLS_REQUIRE_CLIENT_CERT=1), listen on "
                     "127.0.0.1, or say ",
                     override, " to allow it (SECURITY.md)"));
}

namespace {

// The loop's credentials, as an EventLoop::Service.
class LoopCredentials final : public EventLoop::Service {
public:
  explicit LoopCredentials(EventLoop&) {}
  std::shared_ptr<Credentials> credentials;  // null until set or first read
};

}  // namespace

const std::shared_ptr<Credentials>& loopCredentials(EventLoop& loop) {
  auto& service = loop.service<LoopCredentials>();
  if (!service.credentials) service.credentials = Credentials::fromEnvironment();
  return service.credentials;
}

void setLoopCredentials(EventLoop& loop, std::shared_ptr<Credentials> credentials) {
  KJ_REQUIRE(credentials != nullptr,
             "setLoopCredentials() needs credentials; Credentials::none() for none");
  loop.service<LoopCredentials>().credentials = kj::mv(credentials);
}

}  // namespace troupe
