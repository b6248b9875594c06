/// \file
/// A throw-away public-key infrastructure for TLS on loopback in tests: a
/// CA, a server certificate for 127.0.0.1 and localhost, and client
/// certificates, all P-256 and valid for a day (the HTTPS source's tests
/// serve with it; the client tests use a CA that is not the server's).
///
/// Not for production: keys are generated in memory and written unencrypted.
///
/// Thread safety: pure functions (OpenSSL's key generation is thread-safe).
#pragma once

#include <string>

#include "common/status.h"

namespace meshload::pki {

struct CertAndKey {
  std::string cert_pem;
  std::string key_pem;
};

struct TestPki {
  CertAndKey ca;      // self-signed, CA:TRUE
  CertAndKey server;  // signed by ca; SAN IP:127.0.0.1, DNS:localhost
};

/// A new CA and a server certificate signed by it.
Result<TestPki> MakeTestPki();

/// A client certificate signed by `ca` with subject CN=`common_name` (the
/// user name a Kubernetes API server derives from it) and O=`organization`
/// (its group) when not empty; extendedKeyUsage clientAuth.
Result<CertAndKey> MakeClientCert(const CertAndKey& ca, const std::string& common_name,
                                  const std::string& organization = "");

/// Writes `pem` to `path` with mode 0600.
Status WritePem(const std::string& path, const std::string& pem);

}  // namespace meshload::pki
