// A self-signed certificate for TLS tests, made with OpenSSL's API (no openssl binary needed):
// an EC P-256 key and a certificate valid for a day, for localhost and 127.0.0.1.
#pragma once

#include <string>

namespace kvtier::testing {

struct CertFiles {
  std::string cert;  // PEM certificate (also the CA a client trusts)
  std::string key;   // PEM private key
};

// Writes cert.pem and key.pem under `dir` with names starting `stem`; aborts the test run if
// OpenSSL fails (a broken test environment, not a test result).
CertFiles write_self_signed_cert(const std::string& dir, const std::string& stem = "server");

}  // namespace kvtier::testing
