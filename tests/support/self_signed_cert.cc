#include "tests/support/self_signed_cert.h"

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace kvtier::testing {
namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "self_signed_cert: %s failed\n", what);
    std::abort();
  }
}

template <typename T, void (*Free)(T*)>
using Owned = std::unique_ptr<T, decltype([](T* p) { Free(p); })>;

void write_pem(const std::string& path, auto&& writer) {
  FILE* f = std::fopen(path.c_str(), "w");
  check(f != nullptr, "open for writing");
  check(writer(f) == 1, "PEM write");
  std::fclose(f);
}

}  // namespace

CertFiles write_self_signed_cert(const std::string& dir, const std::string& stem) {
  Owned<EVP_PKEY, EVP_PKEY_free> key(EVP_EC_gen("P-256"));
  check(key != nullptr, "EC key generation");
  Owned<X509, X509_free> cert(X509_new());
  check(cert != nullptr, "X509_new");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : {std::pair{NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"},
                                   std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    Owned<X509_EXTENSION, X509_EXTENSION_free> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
    check(ext != nullptr && X509_add_ext(cert.get(), ext.get(), -1) == 1, "certificate extension");
  }
  check(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0, "X509_sign");
  CertFiles files{dir + "/" + stem + "-cert.pem", dir + "/" + stem + "-key.pem"};
  write_pem(files.cert, [&](FILE* f) { return PEM_write_X509(f, cert.get()); });
  write_pem(files.key, [&](FILE* f) {
    return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  return files;
}

}  // namespace kvtier::testing
