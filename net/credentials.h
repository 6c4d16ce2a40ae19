#pragma once
// Credentials: what a process proves itself with and checks its peers against. TLS (kj-tls on
// OpenSSL) for the transport: a certificate and key that servers present (and clients, under
// mutual TLS), and a CA bundle that peers' certificates must chain to. And the cluster token a
// client presents before anything else, and a server requires (SECURITY.md).
//
// Secrets never leave this object: the token and keys are not logged, printed or put in error
// messages; files are named in errors, never their contents.

#include <memory>
#include <string>

#include <kj/array.h>
#include <kj/async-io.h>
#include <kj/compat/tls.h>
#include <kj/time.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/address.h"

namespace troupe {

struct TlsOptions {
  // CA certificates (PEM file) that peers' certificates must chain to. Default "": the
  // system's trust store.
  std::string caFile;

  // This process's certificate chain and private key (PEM files, unencrypted key). Servers need
  // them to listen on tls://; a client presents them when set (mutual TLS). Default "": none.
  std::string certFile;
  std::string keyFile;

  // Servers: accept only clients presenting a certificate from caFile (mutual TLS); such a
  // client is authenticated by its certificate, with or without a token. Default false.
  bool requireClientCertificates = false;

  // Clients: the name a server's certificate must carry. Default "": the host of the address
  // connected to. kj-tls matches DNS names only, so a server reached at an IP address needs that
  // address as a DNS name in its certificate (scripts/make_certs.sh writes both), or this.
  std::string serverName;

  // How long a TLS handshake may take before the connection is closed. Default 10 s.
  kj::Duration handshakeTimeout = 10 * kj::SECONDS;
};

struct CredentialsOptions {
  // TLS files and settings; none (the default) means no TLS: tls:// addresses cannot be listened
  // on, and are connected to with the system's trust store.
  kj::Maybe<TlsOptions> tls;

  // The cluster token: clients present it when they connect; servers with one refuse every
  // connection that does not present it (or a client certificate under mutual TLS). Any bytes.
  // Default "": none.
  std::string token;

  // A file holding the token, read when the Credentials are made (its content without a
  // trailing newline; it must not be empty, hold a NUL byte, or be readable by other users).
  // Set this or `token`, not both. Default "": none.
  std::string tokenFile;

  // The credential of job `jobId`, the job this process is a replica of, which its launcher got
  // from the resolver (Resolver::createJob) and handed over in a file: presented when the
  // process registers an endpoint of that job or asks that job's servers to drain, and required
  // of whoever asks this process's ActorServer to drain. Never presented for another job.
  // Default "": none.
  std::string jobId;
  std::string jobToken;
  std::string jobTokenFile;  // read like tokenFile; set this or jobToken
};

// Loaded credentials. Immutable once made; may be shared by every loop and thread of a process
// (std::shared_ptr: co-owned by the EventLoop whose options name it, and the options structs
// and components that hold it).
class Credentials {
public:
  // Reads the files named; throws INVALID_ARGUMENT naming the file (and the variable it came
  // from, for fromEnvironment()) that is missing, unreadable or not what it should be.
  explicit Credentials(CredentialsOptions options);
  ~Credentials() noexcept(false);
  KJ_DISALLOW_COPY(Credentials);

  // The options the environment names (below), for a program that overrides some of them.
  static CredentialsOptions optionsFromEnvironment();

  // From the environment:
  //   TROUPE_TLS_CA, TROUPE_TLS_CERT, TROUPE_TLS_KEY   TlsOptions' caFile, certFile, keyFile
  //   TROUPE_TLS_REQUIRE_CLIENT_CERT=1                 requireClientCertificates
  //   TROUPE_TLS_SERVER_NAME                           serverName
  //   TROUPE_TOKEN_FILE (a file holding the token), or TROUPE_TOKEN (the token itself)
  //   TROUPE_JOB_TOKEN_FILE, TROUPE_JOB_ID             jobTokenFile, jobId (set by launchers)
  // TLS is on when any TROUPE_TLS_* variable is set. Throws INVALID_ARGUMENT as the constructor
  // does, or when both token variables are set.
  static std::shared_ptr<Credentials> fromEnvironment();

  // No TLS, no token.
  static std::shared_ptr<Credentials> none();

  // Whether this process can listen on tls:// (it has a certificate and key).
  bool canServeTls() const;

  // Whether its tls:// listeners accept only clients with a certificate from the CA (mutual
  // TLS; false when it cannot serve TLS at all). Connections on its other listeners prove
  // nothing by certificate.
  bool requiresClientCertificates() const;

  // The TLS settings it was made with; null without TLS.
  const kj::Maybe<TlsOptions>& tls() const { return options.tls; }

  // The cluster token, empty for none. For presenting to a server only.
  kj::ArrayPtr<const kj::byte> token() const;
  bool hasToken() const { return !options.token.empty(); }

  // Whether `presented` is the cluster token, compared in time that does not depend on where
  // they differ. False when this process has no token.
  bool tokenMatches(kj::ArrayPtr<const kj::byte> presented) const;

  // The credential of job `jobId` if this process holds it, else empty: what to present for an
  // endpoint or a server of that job.
  kj::ArrayPtr<const kj::byte> jobTokenFor(kj::StringPtr jobId) const;
  bool hasJobToken() const { return !options.jobToken.empty(); }

  // Whether `presented` is this process's job credential (as tokenMatches()).
  bool jobTokenMatches(kj::ArrayPtr<const kj::byte> presented) const;

  // The TLS handshake as a server (canServeTls() must hold) or as a client of `address` (a
  // tls:// address), bounded by the handshake timeout of `timer` (the server's by `deadline`
  // when given). Rejects with DISCONNECTED saying what failed (an untrusted or expired
  // certificate, a name mismatch, a peer that does not speak TLS).
  kj::Promise<kj::Own<kj::AsyncIoStream>> wrapServer(kj::Timer& timer,
                                                     kj::Own<kj::AsyncIoStream> stream,
                                                     kj::Maybe<kj::TimePoint> deadline = nullptr);
  kj::Promise<kj::Own<kj::AsyncIoStream>> wrapClient(kj::Timer& timer,
                                                     kj::Own<kj::AsyncIoStream> stream,
                                                     const Address& address);

  // The TLS context clients of tls:// (and https://) addresses use: the trusted CAs (the
  // system's when none are configured) and, under mutual TLS, this process's certificate.
  kj::TlsContext& clientTlsContext() { return *clientTls; }

  // Whether a server with these credentials lets in only clients that prove themselves on
  // `address`: it has a cluster token, or it requires client certificates and `address` is a
  // tls:// one.
  bool authenticatesClients(const Address& address) const {
    return hasToken() || (address.kind == Address::Kind::TLS && requiresClientCertificates());
  }

private:
  CredentialsOptions options;
  kj::Array<kj::TlsCertificate> trustedCertificates;  // from caFile
  kj::Maybe<kj::TlsKeypair> keypair_;                 // from certFile and keyFile
  kj::Own<kj::TlsContext> serverTls;                  // null unless canServeTls()
  kj::Own<kj::TlsContext> clientTls;
};

// Whether `a` and `b` are the same bytes, comparing their SHA-256 digests in constant time, so
// that neither where they differ nor the secret's length shows in the time taken.
bool sameSecret(kj::ArrayPtr<const kj::byte> a, kj::ArrayPtr<const kj::byte> b);

// The secret in the file at `file` (a token: text, its trailing newline dropped), read as
// Credentials reads its token file: refused with INVALID_ARGUMENT naming `what` and the file
// (never the content) when other users may read it, it is empty or not a regular file.
std::string readSecret(kj::StringPtr what, const std::string& file);

// A fresh job credential: 32 random bytes from OpenSSL, as 64 hexadecimal characters.
std::string newJobCredential();

// Whether clients on other machines may be able to connect to `address`: false only for unix
// sockets and loopback hosts (an IPv4 literal in 127.0.0.0/8, ::1, localhost).
bool reachableFromOtherMachines(const Address& address);

// Refuses (INVALID_ARGUMENT, naming the address and the ways out, `override` among them) to
// serve on `address` when other machines may reach it and `credentials` let in anyone there
// (authenticatesClients(address) is false): anyone who could reach the port could call every actor,
// or rewrite every job's endpoints. For programs that listen where they are told (the troupe
// command, hostActor); the ActorServer and RegistryServer classes themselves listen as asked.
void refuseOpenListener(const Address& address, const Credentials& credentials,
                        kj::StringPtr override);

// The credentials of components on `loop` whose own options name none (channels, servers,
// resolvers, the HTTP endpoint): those setLoopCredentials() gave, else
// Credentials::fromEnvironment(), read at the first call (which throws INVALID_ARGUMENT as that
// does). Never null. Loop thread only.
const std::shared_ptr<Credentials>& loopCredentials(EventLoop& loop);

// Makes `credentials` (not null) the loop's, for every component made on `loop` from now on;
// those made already keep what they have. Call it right after making the loop, before anything
// asks for loopCredentials(). Loop thread only.
void setLoopCredentials(EventLoop& loop, std::shared_ptr<Credentials> credentials);

}  // namespace troupe
