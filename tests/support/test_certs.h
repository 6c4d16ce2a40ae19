#pragma once
// Certificates for TLS tests, made with the openssl command (scripts/make_certs.sh): under
// ctest, once per run into $TROUPE_TEST_CERTS_DIR (tests/CMakeLists.txt); otherwise the first
// time a test asks, in a temporary folder removed when the test program exits.

#include <memory>
#include <string>

#include "troupe/net/credentials.h"

namespace troupe::test {

struct TestCerts {
  std::string dir;
  std::string ca;                           // the CA that signed cert, expired and wrongName
  std::string cert, key;                    // valid for localhost, 127.0.0.1 and ::1
  std::string otherCa;                      // a second CA
  std::string otherCert, otherKey;          // signed by otherCa, for the same names
  std::string expiredCert, expiredKey;      // signed by ca, valid only in 2020
  std::string wrongNameCert, wrongNameKey;  // signed by ca, for elsewhere.invalid only
};

// Made once per process; throws if openssl fails.
const TestCerts& testCerts();

// Credentials holding `cert`/`key` (when given), trusting `ca` (when given), with `token`.
std::shared_ptr<Credentials> tlsCredentials(const std::string& ca, const std::string& cert = "",
                                            const std::string& key = "",
                                            bool requireClientCertificates = false,
                                            const std::string& token = "");

// A server's credentials: certs().cert and key, trusting certs().ca.
std::shared_ptr<Credentials> serverCredentials(bool requireClientCertificates = false,
                                               const std::string& token = "");

// A client's: trusting certs().ca, no certificate of its own.
std::shared_ptr<Credentials> clientCredentials(const std::string& token = "");

}  // namespace troupe::test
