#include "tests/support/test_certs.h"

#include <ftw.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>

#include "tests/support/child_process.h"

namespace troupe::test {

namespace {

int removeEntry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }

struct CertsFolder {
  CertsFolder() {
    // ctest makes them once for every test (tests/CMakeLists.txt); alone, a test makes its own.
    const char* shared = ::getenv("TROUPE_TEST_CERTS_DIR");
    if (shared != nullptr && *shared != '\0') {
      certs.dir = shared;
    } else {
      char pattern[] = "/tmp/troupe-certs-XXXXXX";
      if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
      certs.dir = pattern;
      ownsDir = true;
      ChildProcess make(TROUPE_MAKE_CERTS_PATH, {certs.dir}, {"TROUPE_CERTS_FOR_TESTS=1"});
      int status = make.wait(60000);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        throw std::runtime_error("scripts/make_certs.sh failed");
      }
    }
    auto at = [&](const char* name) { return certs.dir + "/" + name; };
    certs.ca = at("ca.pem");
    certs.cert = at("node.pem");
    certs.key = at("node.key");
    certs.otherCa = at("other-ca.pem");
    certs.otherCert = at("other.pem");
    certs.otherKey = at("other.key");
    certs.expiredCert = at("expired.pem");
    certs.expiredKey = at("expired.key");
    certs.wrongNameCert = at("wrong-name.pem");
    certs.wrongNameKey = at("wrong-name.key");
  }
  ~CertsFolder() {
    if (ownsDir) ::nftw(certs.dir.c_str(), removeEntry, 8, FTW_DEPTH | FTW_PHYS);
  }

  TestCerts certs;
  bool ownsDir = false;
};

}  // namespace

const TestCerts& testCerts() {
  static CertsFolder folder;
  return folder.certs;
}

std::shared_ptr<Credentials> tlsCredentials(const std::string& ca, const std::string& cert,
                                            const std::string& key, bool requireClientCertificates,
                                            const std::string& token) {
  TlsOptions tls;
  tls.caFile = ca;
  tls.certFile = cert;
  tls.keyFile = key;
  tls.requireClientCertificates = requireClientCertificates;
  return std::make_shared<Credentials>(CredentialsOptions{.tls = kj::mv(tls), .token = token});
}

std::shared_ptr<Credentials> serverCredentials(bool requireClientCertificates,
                                               const std::string& token) {
  auto& c = testCerts();
  return tlsCredentials(c.ca, c.cert, c.key, requireClientCertificates, token);
}

std::shared_ptr<Credentials> clientCredentials(const std::string& token) {
  return tlsCredentials(testCerts().ca, "", "", false, token);
}

}  // namespace troupe::test
