#include "tests/testing/test_pki.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <utility>
#include <vector>

namespace meshload::pki {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Free>;
using CertPtr = std::unique_ptr<X509, Free>;
using BioPtr = std::unique_ptr<BIO, Free>;

std::string BioString(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

Result<std::string> CertPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return Internal("cannot encode a certificate");
  return BioString(bio.get());
}

Result<std::string> KeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return Internal("cannot encode a private key");
  }
  return BioString(bio.get());
}

Result<std::pair<CertPtr, KeyPtr>> Parse(const CertAndKey& ck) {
  BioPtr cbio(BIO_new_mem_buf(ck.cert_pem.data(), static_cast<int>(ck.cert_pem.size())));
  BioPtr kbio(BIO_new_mem_buf(ck.key_pem.data(), static_cast<int>(ck.key_pem.size())));
  CertPtr cert(cbio ? PEM_read_bio_X509(cbio.get(), nullptr, nullptr, nullptr) : nullptr);
  KeyPtr key(kbio ? PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert || !key) return InvalidArgument("not a PEM certificate and private key");
  return std::make_pair(std::move(cert), std::move(key));
}

// Issues a certificate for a new P-256 key: self-signed when `issuer` is
// null. `extensions` are (NID, OpenSSL config value) pairs.
Result<CertAndKey> Issue(const std::vector<std::pair<std::string, std::string>>& subject,
                         const std::vector<std::pair<int, std::string>>& extensions, X509* issuer,
                         EVP_PKEY* issuer_key) {
  KeyPtr key(EVP_EC_gen("P-256"));
  CertPtr cert(X509_new());
  if (!key || !cert) return Internal("cannot generate a key");
  unsigned char serial[16];
  bool ok = RAND_bytes(serial, sizeof serial) == 1;
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = ok ? BN_bin2bn(serial, sizeof serial, nullptr) : nullptr;
  ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(bn);
  ok = ok && X509_set_version(cert.get(), 2) == 1;
  ok = ok && X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300) != nullptr;
  ok = ok && X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600) != nullptr;
  ok = ok && X509_set_pubkey(cert.get(), key.get()) == 1;
  X509_NAME* name = X509_get_subject_name(cert.get());
  for (const auto& [field, value] : subject) {
    ok = ok && X509_NAME_add_entry_by_txt(name, field.c_str(), MBSTRING_ASC,
                                          reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0) == 1;
  }
  X509* signer = issuer != nullptr ? issuer : cert.get();
  EVP_PKEY* signer_key = issuer != nullptr ? issuer_key : key.get();
  ok = ok && X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) == 1;
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, signer, cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : extensions) {
    if (!ok) break;
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    ok = ext != nullptr && X509_add_ext(cert.get(), ext, -1) == 1;
    X509_EXTENSION_free(ext);
  }
  ok = ok && X509_sign(cert.get(), signer_key, EVP_sha256()) > 0;
  if (!ok) return Internal("cannot issue a certificate");
  MESHLOAD_ASSIGN_OR_RETURN(std::string cert_pem, CertPem(cert.get()));
  MESHLOAD_ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
  return CertAndKey{std::move(cert_pem), std::move(key_pem)};
}

}  // namespace

Result<TestPki> MakeTestPki() {
  TestPki pki;
  MESHLOAD_ASSIGN_OR_RETURN(pki.ca, Issue({{"CN", "meshload-test-ca"}},
                                          {{NID_basic_constraints, "critical,CA:TRUE"},
                                           {NID_key_usage, "critical,keyCertSign,cRLSign,digitalSignature"},
                                           {NID_subject_key_identifier, "hash"}},
                                          nullptr, nullptr));
  MESHLOAD_ASSIGN_OR_RETURN(auto ca, Parse(pki.ca));
  MESHLOAD_ASSIGN_OR_RETURN(pki.server, Issue({{"CN", "127.0.0.1"}},
                                              {{NID_basic_constraints, "critical,CA:FALSE"},
                                               {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
                                               {NID_ext_key_usage, "serverAuth"},
                                               {NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost"}},
                                              ca.first.get(), ca.second.get()));
  return pki;
}

Result<CertAndKey> MakeClientCert(const CertAndKey& ca, const std::string& common_name,
                                  const std::string& organization) {
  MESHLOAD_ASSIGN_OR_RETURN(auto issuer, Parse(ca));
  std::vector<std::pair<std::string, std::string>> subject;
  if (!organization.empty()) subject.emplace_back("O", organization);
  subject.emplace_back("CN", common_name);
  return Issue(subject,
               {{NID_basic_constraints, "critical,CA:FALSE"},
                {NID_key_usage, "critical,digitalSignature"},
                {NID_ext_key_usage, "clientAuth"}},
               issuer.first.get(), issuer.second.get());
}

Status WritePem(const std::string& path, const std::string& pem) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return IoErrorFromErrno("cannot create", path, errno);
  size_t done = 0;
  while (done < pem.size()) {
    ssize_t n = ::write(fd, pem.data() + done, pem.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      return IoErrorFromErrno("cannot write", path, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return IoErrorFromErrno("cannot close", path, errno);
  return Status::Ok();
}

}  // namespace meshload::pki
