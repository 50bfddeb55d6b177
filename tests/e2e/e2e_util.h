/* e2e_util.h: helpers for the end-to-end tests: a real fusemld in a temp directory, raw
 * connections speaking frames, request packing and reply reading. */
#ifndef FM_E2E_UTIL_H
#define FM_E2E_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <msgpack.h>

typedef struct e2e_daemon {
  const char *exe;
  char dir[256]; /* mkdtemp */
  char sock[320];
  char db[320];
  char log[320];
  pid_t pid; /* 0 when not running */
} e2e_daemon;

/* Creates the temp directory. */
int e2e_setup(e2e_daemon *d, const char *exe);
/* Starts fusemld --foreground on the temp socket and db (plus extra args, NULL-terminated
 * array or NULL) and waits until it accepts connections. 0 on success. */
int e2e_start(e2e_daemon *d, const char *const *extra);
/* Runs fusemld with the temp socket/db and extra args to completion (it is expected to refuse
 * to start); returns its wait status, or -1 if it was still running after timeout_ms. */
int e2e_run(e2e_daemon *d, const char *const *extra, int timeout_ms);
/* True if the daemon log contains text. */
int e2e_log_contains(const e2e_daemon *d, const char *text);
/* Sends sig and waits for the exit; returns the wait status, or -1 on timeout (then killed). */
int e2e_stop(e2e_daemon *d, int sig, int timeout_ms);
/* Kills any running daemon and removes the directory (keeps the log on stderr if dump). */
void e2e_teardown(e2e_daemon *d, int dump_log);

/* CLOCK_MONOTONIC in ms, and a sleep. */
double e2e_now_ms(void);
void e2e_sleep_ms(int ms);

/* A connected socket, or -1. */
int e2e_connect(const char *sock);
int e2e_send_raw(int fd, const void *p, size_t n);
int e2e_send_frame(int fd, const void *payload, size_t len);
/* Reads one frame: 0 and the reply unpacked into zone; -1 EOF, -2 timeout, -3 bad frame. */
int e2e_recv(int fd, int timeout_ms, msgpack_zone *zone, msgpack_object *obj);
/* 1 if the peer closed the connection within timeout_ms (EOF or reset), else 0. */
int e2e_wait_closed(int fd, int timeout_ms);

/* The start of a test's main(argc = 2, argv[1] the fusemld to test): SIGPIPE ignored, the temp
 * directory made, the daemon started with no extra args. 0, or (having said why) the status
 * for main to return. */
int e2e_main_start(e2e_daemon *d, int argc, char **argv);
/* Stops the daemon if it runs (SIGTERM) and starts it again with extra args; 0 on success. */
int e2e_restart(e2e_daemon *d, const char *const *extra);
/* A process's resident memory in KiB (VmRSS from /proc/PID/status), or -1. */
long e2e_rss_kb(pid_t pid);

/* A request being packed: {op, id, <n_fields pairs the caller packs>}. */
typedef struct e2e_req {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} e2e_req;
void e2e_req_begin(e2e_req *r, const char *op, uint64_t id, uint32_t n_fields);
/* Sends and frees. */
int e2e_req_send(e2e_req *r, int fd);

/* Packs a pointwise fragment: x f32 [-1, 256] through n_ops ops salted with `salt` (distinct
 * salts give distinct fragments and keys). */
void e2e_pack_fragment(msgpack_packer *pk, double salt, int n_ops);

/* Packs x f32 [-1, 256] raised n_pows times in a chain to a constant exponent (not one the
 * code generator special-cases, such as 2 or 0.5, so each is a powf): the costliest fragment
 * to compile per op (255 of them held NVRTC for ~50 s). Distinct exponents, distinct keys. */
void e2e_pack_pow_chain(msgpack_packer *pk, double exponent, int n_pows);

/* A connected socket that has said hello, or -1. */
int e2e_client(const char *sock);
/* hello with FM_PROTO_VERSION; 0 on an ok reply. */
int e2e_hello(int fd);
/* A connection to d that has said hello, or -1. */
int e2e_connect_hello(const e2e_daemon *d);
/* compile the salted fragment on fd; fills origin (and key hex) from the reply. Returns 0 for an
 * ok reply, else -1 (code copied into origin). */
int e2e_compile(int fd, uint64_t id, double salt, int n_ops, char origin[16], char key[65]);
/* stats: a counter from "stats" (persistent) or "session", or a top-level field. -1 on failure. */
int64_t e2e_stat(int fd, const char *section, const char *name);

/* A private mount namespace (and a user namespace when not root, mapping us to root there)
 * for this process and its children. 0, or -1 with why. */
int e2e_private_mounts(char *why, size_t cap);

/* Runs argv[0] with argv (NULL-terminated), its stdout and stderr written to out_path and
 * err_path (NULL: /dev/null). Returns its wait status, or -1 (killed) after timeout_ms. */
int e2e_run_tool(const char *const *argv, const char *out_path, const char *err_path, int timeout_ms);
/* A whole file, NUL-terminated (malloc'd; *len its size when len is not NULL), or NULL. */
char *e2e_slurp(const char *path, size_t *len);

/* Reply field helpers. */
int e2e_is_ok(const msgpack_object *o);
/* Copies a str field ("" if absent). */
void e2e_str(const msgpack_object *o, const char *key, char *out, size_t cap);

#endif
