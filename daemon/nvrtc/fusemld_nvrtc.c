/* fusemld_nvrtc.c: fusemld-nvrtc, the child process one NVRTC compile runs in
 * (daemon/fm_nvrtc_child.h has the protocol). NVRTC cannot be interrupted inside a thread,
 * and one generated source can keep it busy for a minute and take half a gigabyte: in a
 * process of its own the daemon can kill it at its deadline, or when every client that
 * wanted it has gone, and the kernel bounds its memory.
 *
 *   fusemld-nvrtc --fd 3 --arch sm_90a --name fm_1234.cu --memory BYTES --cpu SECS
 *
 * The memory bound is on address space (RLIMIT_AS), set here rather than before exec: a
 * sanitizer build reserves terabytes of shadow at startup, so the bound is what this process
 * may add to what it holds once started. Past it NVRTC's allocations fail: it answers
 * out-of-memory, or aborts (the daemon sees it die). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <msgpack.h>

#include "fm_frame.h"
#include "fm_msg.h"
#include "fm_nvrtc.h"

#define LOG_MAX (64u << 10) /* NVRTC log bytes sent back (the daemon keeps less) */

/* Under AddressSanitizer a failed allocation returns NULL (NVRTC then reports
 * out-of-memory) instead of ending the process with a sanitizer report. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* Bytes of address space this process holds now (/proc/self/statm: size in pages). */
static unsigned long long address_space_now(void) {
  unsigned long long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%llu", &pages) != 1) pages = 0;
    fclose(f);
  }
  return pages * (unsigned long long)sysconf(_SC_PAGESIZE);
}

static void set_limits(unsigned long long memory, unsigned long long cpu_s) {
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  if (memory) {
    unsigned long long as = address_space_now() + memory;
    struct rlimit r = {as, as};
    setrlimit(RLIMIT_AS, &r);
  }
  if (cpu_s) {
    /* A backstop only: the daemon kills us at the wall-clock deadline. */
    struct rlimit r = {cpu_s, cpu_s + 1};
    setrlimit(RLIMIT_CPU, &r);
  }
}

/* Reads the one request frame (the source) from fd; NULL on EOF or error. */
static char *read_source(int fd, fm_frame_reader *rd) {
  const uint8_t *payload;
  size_t len;
  uint8_t buf[65536];
  while (!fm_frame_reader_next(rd, &payload, &len)) {
    ssize_t got = read(fd, buf, sizeof buf);
    if (got <= 0 || fm_frame_reader_feed(rd, buf, (size_t)got)) return NULL;
  }
  char *src = malloc(len + 1);
  if (!src) return NULL;
  memcpy(src, payload, len);
  src[len] = '\0';
  return src;
}

static int write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t put = write(fd, b, n);
    if (put <= 0) return -1;
    b += put;
    n -= (size_t)put;
  }
  return 0;
}

/* {rc: int, log: str, cubin: bin} as one frame. */
static int reply(int fd, int rc, const char *log, const uint8_t *cubin, size_t cubin_len) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  uint8_t hdr[FM_FRAME_HEADER_BYTES];
  size_t log_len = log ? strlen(log) : 0;
  if (log_len > LOG_MAX) log_len = LOG_MAX;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  fm_pack_kv_i64(&pk, "rc", rc);
  fm_pack_cstr(&pk, "log");
  msgpack_pack_str(&pk, log_len);
  msgpack_pack_str_body(&pk, log ? log : "", log_len);
  fm_pack_cstr(&pk, "cubin");
  fm_pack_bin(&pk, cubin, cubin_len);
  int err = !sb.data;
  if (!err) {
    fm_frame_header(hdr, (uint32_t)sb.size);
    err = write_all(fd, hdr, sizeof hdr) || write_all(fd, sb.data, sb.size);
  }
  msgpack_sbuffer_destroy(&sb);
  return err;
}

/* ptxas, inside NVRTC, writes some failures to stderr rather than to the program log (an
 * allocation past the memory bound: "Memory allocation failure"): stderr goes to a memory
 * file, read back into the log. */
static int capture_stderr(void) {
  int fd = memfd_create("fusemld-nvrtc-stderr", 0);
  if (fd >= 0 && dup2(fd, STDERR_FILENO) < 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* log (may be NULL) with what was written to stderr after it, malloc'd; log itself if
 * nothing was (or on any failure). */
static char *with_stderr(char *log, int fd) {
  char buf[4096];
  off_t n = fd >= 0 ? lseek(fd, 0, SEEK_END) : 0;
  if (n <= 0 || lseek(fd, n > (off_t)sizeof buf - 1 ? n - (off_t)sizeof buf + 1 : 0, SEEK_SET) < 0) return log;
  ssize_t got = read(fd, buf, sizeof buf - 1);
  if (got <= 0) return log;
  buf[got] = '\0';
  size_t len = log ? strlen(log) : 0;
  char *out = malloc(len + (size_t)got + 2);
  if (!out) return log;
  snprintf(out, len + (size_t)got + 2, "%s%s%s", log ? log : "", len ? "\n" : "", buf);
  free(log);
  return out;
}

/* NVRTC reports an allocation that failed as a compile error; under a memory bound that is
 * the bound, and the daemon must say so. */
static int out_of_memory(const char *log) {
  return log &&
         (strstr(log, "Memory allocation failure") || strstr(log, "out of memory") || strstr(log, "std::bad_alloc"));
}

static const char *flag(int argc, char **argv, const char *name) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return NULL;
}

int main(int argc, char **argv) {
  const char *fd_s = flag(argc, argv, "--fd"), *arch = flag(argc, argv, "--arch");
  const char *name = flag(argc, argv, "--name"), *mem_s = flag(argc, argv, "--memory");
  const char *cpu_s = flag(argc, argv, "--cpu");
  if (!fd_s || !arch || !name) {
    fprintf(stderr,
            "usage: fusemld-nvrtc --fd N --arch ARCH --name NAME [--memory BYTES] [--cpu SECS]\n"
            "(started by fusemld for each compile)\n");
    return 2;
  }
  int fd = atoi(fd_s);
  fm_frame_reader rd;
  fm_frame_reader_init(&rd, FM_FRAME_MAX_REPLY);
  char *src = read_source(fd, &rd);
  fm_frame_reader_free(&rd);
  if (!src) return 3;
  set_limits(mem_s ? strtoull(mem_s, NULL, 10) : 0, cpu_s ? strtoull(cpu_s, NULL, 10) : 0);

  uint8_t *cubin = NULL;
  size_t cubin_len = 0;
  char *log = NULL;
  int err_fd = capture_stderr();
  int rc = fm_nvrtc_compile(src, name, arch, &cubin, &cubin_len, &log);
  if (rc != FM_OK) log = with_stderr(log, err_fd);
  if (rc == FM_ECOMPILE && out_of_memory(log)) rc = FM_ENOMEM;
  int err = reply(fd, rc, log, cubin, cubin_len);
  free(src);
  free(cubin);
  free(log);
  return err ? 4 : 0;
}
