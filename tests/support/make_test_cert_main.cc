// make_test_cert DIR: writes DIR/server-cert.pem and DIR/server-key.pem (self-signed, for
// localhost and 127.0.0.1) for the Python TLS tests.
#include <cstdio>

#include "tests/support/self_signed_cert.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_test_cert DIR\n");
    return 2;
  }
  const auto files = kvtier::testing::write_self_signed_cert(argv[1]);
  std::printf("%s\n%s\n", files.cert.c_str(), files.key.c_str());
  return 0;
}
