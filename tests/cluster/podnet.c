// LD_PRELOAD for the processes tests/cluster/pod_runner.py runs as
// containers of simulated pods: every pod on this one machine would bind the
// same ports (the sidecar's 9464 and 7441, the controller's webhook and
// metrics) on the wildcard address, as containers do in their own network
// namespaces. This turns a bind() to 0.0.0.0 into a bind() to the pod's IP
// ($MESHLOAD_PODNET_IP, one of kwok's 127.x pod IPs), and leaves every other
// bind alone. An IPv6 wildcard bind becomes the IPv4-mapped pod IP only when
// the socket accepts IPv4 (not IPV6_V6ONLY); otherwise it is left as is.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr*, socklen_t);

int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  static bind_fn real_bind;
  if (real_bind == NULL) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  const char* ip = getenv("MESHLOAD_PODNET_IP");
  struct in_addr pod;
  if (ip == NULL || addr == NULL || inet_pton(AF_INET, ip, &pod) != 1) return real_bind(fd, addr, len);
  if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
      a.sin_addr = pod;
      return real_bind(fd, (const struct sockaddr*)&a, sizeof a);
    }
  } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    int v6only = 0;
    socklen_t optlen = sizeof v6only;
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) && getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &optlen) == 0 &&
        !v6only) {
      memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
      a.sin6_addr.s6_addr[10] = 0xff;
      a.sin6_addr.s6_addr[11] = 0xff;
      memcpy(&a.sin6_addr.s6_addr[12], &pod, 4);
      return real_bind(fd, (const struct sockaddr*)&a, sizeof a);
    }
  }
  return real_bind(fd, addr, len);
}
