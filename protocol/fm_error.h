/* fm_error.h: every error code fusemld uses, from one X-macro table.
 *
 * Codes are negative ints (0 is success), as in libuv. Each has a stable
 * slug that travels in error replies ({ok:false, code:<slug>, ...}) so a
 * client written in any language can switch on it, and a human message. */
#ifndef FM_ERROR_H
#define FM_ERROR_H

#include <stddef.h>

/* XX(value, NAME, "slug", "message") */
#define FM_ERR_MAP(XX)                                                           \
  XX(-1, EINVAL, "invalid_argument", "invalid argument")                         \
  XX(-2, ENOMEM, "out_of_memory", "out of memory")                               \
  XX(-3, ETOOBIG, "frame_too_large", "frame exceeds the maximum size")           \
  XX(-4, EMALFORMED, "malformed", "malformed msgpack")                           \
  XX(-5, ESCHEMA, "bad_request", "request does not match the schema")            \
  XX(-6, ELIMIT, "limit_exceeded", "a protocol limit was exceeded")              \
  XX(-7, EUNKNOWN_OP, "unknown_op", "unknown operation in fragment")             \
  XX(-8, EUNKNOWN_REQ, "unknown_request", "unknown request")                     \
  XX(-9, EHANDSHAKE, "handshake_required", "send hello first")                   \
  XX(-10, EPROTO_VERSION, "protocol_version", "unsupported protocol version")    \
  XX(-11, EUNSUPPORTED, "unsupported", "fragment not supported by this codegen") \
  XX(-12, ECODEGEN, "codegen_failed", "code generation failed")                  \
  XX(-13, ECOMPILE, "compile_failed", "NVRTC compile failed")                    \
  XX(-14, ENOT_FOUND, "not_found", "no such entry")                              \
  XX(-15, ESTORE, "store_error", "kernel store error")                           \
  XX(-16, ECORRUPT, "corrupt_entry", "cache entry failed its checksum")          \
  XX(-17, EIO, "io_error", "input/output error")                                 \
  XX(-18, ETIMEOUT, "timeout", "operation timed out")                            \
  XX(-19, ENOGPU, "no_gpu", "no usable GPU")                                     \
  XX(-20, ECUDA, "cuda_error", "CUDA driver error")                              \
  XX(-21, EBUSY, "busy", "server busy")                                          \
  XX(-22, ESHUTDOWN, "shutting_down", "daemon is shutting down")                 \
  XX(-23, ECLOSED, "connection_closed", "connection closed")                     \
  XX(-24, EPROTOCOL, "protocol_error", "protocol error")                         \
  XX(-25, EDENIED, "permission_denied", "permission denied")                     \
  XX(-26, ECOMPILE_TIMEOUT, "compile_timeout", "compile deadline passed")

typedef enum {
  FM_OK = 0,
#define FM_ERR_ENUM_(value, name, slug, msg) FM_##name = (value),
  FM_ERR_MAP(FM_ERR_ENUM_)
#undef FM_ERR_ENUM_
} fm_err;

/* Human message for an error code; "unknown error" for codes not in the map. */
const char *fm_strerror(int err);
/* Stable slug ("bad_request"); "unknown" for codes not in the map. */
const char *fm_err_slug(int err);
/* Inverse of fm_err_slug; FM_EPROTOCOL for an unknown slug. */
int fm_err_from_slug(const char *slug, size_t len);

/* A diagnostic: the "detail" of an error reply. Fixed size so it can be filled
 * anywhere without allocation; text is always NUL-terminated. */
typedef struct fm_diag {
  char text[1024];
} fm_diag;

/* printf into d (truncating); returns err so callers can `return fm_diag_set(d, FM_EINVAL, ...)`.
 * d may be NULL. */
int fm_diag_set(fm_diag *d, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
