// ps_request_count.c — an LD_PRELOAD shim for benchmarks/load_jobs.sh: counts the dtf frames a
// process reads from its accepted TCP connections (the requests a ps serves, by message kind),
// the connections it accepts and holds open at once, and its CPU time; written at exit to
// $DTF_LOAD_STATS_DIR/$DTF_TASK.<pid>.txt as one line of key=value tokens. A benchmark tool,
// not part of dtf: it reads the bytes the program's own read/recv/recvmsg calls return (it
// never reads a socket itself) and parses them with the wire format of
// include/dtf/detail/frame.hpp (32-byte header: magic "DTF1", version, kind at offset 6,
// meta_size at 8, payload_size at 24; plain TCP only, not TLS).
//
//   cc -O2 -shared -fPIC -o ps_request_count.so ps_request_count.c -ldl -lpthread
//
// Tokens: task, pid, utime_s, stime_s (getrusage at exit, every thread), serve_cpu_s (CPU
// since the first request frame: the process's start-up, e.g. loading the data set, left out),
// requests (frames of kind 16..63: ps requests, the synchronous protocol's 33 stage, 34 apply,
// 35 decision and 36 hold included), handshake (kinds 1..5), heartbeat (kind 6),
// kind_<k> for each kind seen, accepted (connections accepted), peak_open (most accepted
// connections open at once), bytes_in (bytes read from accepted connections), unparsed (bytes
// of connections whose stream did not parse as dtf frames), vcsw and ivcsw (voluntary and
// involuntary context switches, getrusage).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FD 65536
#define KINDS 128

enum { FD_UNKNOWN = 0, FD_TRACKED, FD_BROKEN };

struct fd_state {
  pthread_mutex_t mu;
  int kind;                 // FD_UNKNOWN (not an accepted socket), FD_TRACKED, FD_BROKEN
  unsigned char head[32];   // the header being read
  unsigned have;            // bytes of head held
  uint64_t skip;            // bytes of meta and payload still to pass over
};

static struct fd_state fds[MAX_FD];
static atomic_ullong kinds[KINDS];
static atomic_ullong bytes_in, unparsed, accepted;
static atomic_long open_now, peak_open;
static atomic_int first_seen;
static double serve_start_cpu = -1;
static int active;  // DTF_LOAD_STATS_DIR set

static ssize_t (*real_read)(int, void*, size_t);
static ssize_t (*real_recv)(int, void*, size_t, int);
static ssize_t (*real_recvmsg)(int, struct msghdr*, int);
static int (*real_accept)(int, struct sockaddr*, socklen_t*);
static int (*real_accept4)(int, struct sockaddr*, socklen_t*, int);
static int (*real_close)(int);

static void resolve(void) {
  if (real_close) return;
  real_read = dlsym(RTLD_NEXT, "read");
  real_recv = dlsym(RTLD_NEXT, "recv");
  real_recvmsg = dlsym(RTLD_NEXT, "recvmsg");
  real_accept = dlsym(RTLD_NEXT, "accept");
  real_accept4 = dlsym(RTLD_NEXT, "accept4");
  real_close = dlsym(RTLD_NEXT, "close");
}

static double cpu_now(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

static uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Feeds n bytes read from fd through its frame parser. Caller holds s->mu.
static void feed(struct fd_state* s, const unsigned char* p, size_t n) {
  atomic_fetch_add(&bytes_in, n);
  while (n > 0) {
    if (s->kind == FD_BROKEN) {
      atomic_fetch_add(&unparsed, n);
      return;
    }
    if (s->skip > 0) {
      size_t k = s->skip < n ? (size_t)s->skip : n;
      s->skip -= k, p += k, n -= k;
      continue;
    }
    size_t k = 32 - s->have;
    if (k > n) k = n;
    memcpy(s->head + s->have, p, k);
    s->have += k, p += k, n -= k;
    if (s->have < 32) return;
    s->have = 0;
    if (le(s->head, 4) != 0x31465444u) {
      s->kind = FD_BROKEN;
      atomic_fetch_add(&unparsed, 32);
      continue;
    }
    unsigned kind = (unsigned)le(s->head + 6, 2);
    atomic_fetch_add(&kinds[kind < KINDS ? kind : KINDS - 1], 1);
    if (kind >= 16 && kind < 64 && !atomic_exchange(&first_seen, 1)) serve_start_cpu = cpu_now();
    s->skip = le(s->head + 8, 4) + le(s->head + 24, 8);
  }
}

static void track_accept(int fd) {
  if (fd < 0 || fd >= MAX_FD || !active) return;
  struct fd_state* s = &fds[fd];
  pthread_mutex_lock(&s->mu);
  s->kind = FD_TRACKED, s->have = 0, s->skip = 0;
  pthread_mutex_unlock(&s->mu);
  atomic_fetch_add(&accepted, 1);
  long now = atomic_fetch_add(&open_now, 1) + 1;
  long peak = atomic_load(&peak_open);
  while (now > peak && !atomic_compare_exchange_weak(&peak_open, &peak, now)) {
  }
}

static void seen(int fd, const struct iovec* iov, int iovcnt, ssize_t got) {
  if (got <= 0 || fd < 0 || fd >= MAX_FD || !active) return;
  struct fd_state* s = &fds[fd];
  if (s->kind == FD_UNKNOWN) return;  // written only under the accept that precedes any read
  pthread_mutex_lock(&s->mu);
  size_t left = (size_t)got;
  for (int i = 0; i < iovcnt && left > 0; ++i) {
    size_t k = iov[i].iov_len < left ? iov[i].iov_len : left;
    feed(s, iov[i].iov_base, k);
    left -= k;
  }
  pthread_mutex_unlock(&s->mu);
}

ssize_t read(int fd, void* buf, size_t n) {
  resolve();
  ssize_t r = real_read(fd, buf, n);
  struct iovec v = {buf, n};
  seen(fd, &v, 1, r);
  return r;
}

ssize_t recv(int fd, void* buf, size_t n, int flags) {
  resolve();
  ssize_t r = real_recv(fd, buf, n, flags);
  if (!(flags & MSG_PEEK)) {
    struct iovec v = {buf, n};
    seen(fd, &v, 1, r);
  }
  return r;
}

ssize_t recvmsg(int fd, struct msghdr* m, int flags) {
  resolve();
  ssize_t r = real_recvmsg(fd, m, flags);
  if (!(flags & MSG_PEEK)) seen(fd, m->msg_iov, (int)m->msg_iovlen, r);
  return r;
}

int accept(int fd, struct sockaddr* a, socklen_t* l) {
  resolve();
  int r = real_accept(fd, a, l);
  track_accept(r);
  return r;
}

int accept4(int fd, struct sockaddr* a, socklen_t* l, int flags) {
  resolve();
  int r = real_accept4(fd, a, l, flags);
  track_accept(r);
  return r;
}

int close(int fd) {
  if (active && fd >= 0 && fd < MAX_FD && fds[fd].kind != FD_UNKNOWN) {
    struct fd_state* s = &fds[fd];
    pthread_mutex_lock(&s->mu);
    if (s->kind != FD_UNKNOWN) {
      s->kind = FD_UNKNOWN;
      atomic_fetch_sub(&open_now, 1);
    }
    pthread_mutex_unlock(&s->mu);
  }
  resolve();
  return real_close(fd);
}

__attribute__((constructor)) static void init(void) {
  resolve();
  for (int i = 0; i < MAX_FD; ++i) pthread_mutex_init(&fds[i].mu, NULL);
  active = getenv("DTF_LOAD_STATS_DIR") != NULL;
}

__attribute__((destructor)) static void report(void) {
  if (!active) return;
  const char* dir = getenv("DTF_LOAD_STATS_DIR");
  const char* task = getenv("DTF_TASK");
  if (!task) task = "unknown";
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%d.txt", dir, task, (int)getpid());
  FILE* f = fopen(path, "w");
  if (!f) return;
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  const double ut = u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6, st = u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
  unsigned long long req = 0, hs = 0;
  for (int k = 16; k < 64; ++k) req += kinds[k];
  for (int k = 1; k <= 5; ++k) hs += kinds[k];
  fprintf(f, "task=%s pid=%d utime_s=%.3f stime_s=%.3f serve_cpu_s=%.3f requests=%llu handshake=%llu heartbeat=%llu",
          task, (int)getpid(), ut, st, serve_start_cpu < 0 ? 0.0 : ut + st - serve_start_cpu, req, hs,
          (unsigned long long)kinds[6]);
  for (int k = 0; k < KINDS; ++k)
    if (kinds[k]) fprintf(f, " kind_%d=%llu", k, (unsigned long long)kinds[k]);
  fprintf(f, " accepted=%llu peak_open=%ld bytes_in=%llu unparsed=%llu vcsw=%ld ivcsw=%ld\n",
          (unsigned long long)accepted, (long)peak_open, (unsigned long long)bytes_in, (unsigned long long)unparsed,
          u.ru_nvcsw, u.ru_nivcsw);
  fclose(f);
}
