/*
 * dtrain.h — the public interface of libdtrain.
 *
 * This header is the specification: every public function is documented where
 * it is declared. It holds the error model shared by every layer. Layer
 * headers (src/<layer>/<layer>.h) are internal to the library; the public
 * surface grows here as layers stabilise.
 */
#ifndef DTRAIN_H
#define DTRAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_VERSION_MAJOR 0
#define DT_VERSION_MINOR 1
#define DT_VERSION_PATCH 0
#define DT_VERSION_STRING "0.1.0"

/*
 * Error codes. Every fallible function returns DT_OK (0) or one of these
 * negative codes. The X-macro keeps the enum and dt_strerror() in step.
 */
#define DT_ERRNO_MAP(X)                                                       \
  X(OK, 0, "success")                                                         \
  X(EINVAL, -1, "invalid argument")                                           \
  X(ENOMEM, -2, "out of memory")                                              \
  X(EIO, -3, "input/output error")                                            \
  X(ETIMEDOUT, -4, "deadline expired")                                        \
  X(EPEERLOST, -5, "peer lost")                                               \
  X(EMISMATCH, -6, "mismatch between ranks")                                  \
  X(EAUTH, -7, "authentication failed")                                       \
  X(EPROTO, -8, "protocol error")                                             \
  X(ECORRUPT, -9, "corrupt data")                                             \
  X(ENOTSUP, -10, "not supported")                                            \
  X(ENOENT, -11, "no such file or key")                                       \
  X(ECLOSED, -12, "closed")                                                   \
  X(EAGAIN, -13, "try again")                                                 \
  X(EABORTED, -14, "aborted")                                                 \
  X(ERANGE, -15, "value out of range")

typedef enum dt_errno {
#define DT__ERR_ENUM(name, val, msg) DT_##name = (val),
  DT_ERRNO_MAP(DT__ERR_ENUM)
#undef DT__ERR_ENUM
} dt_errno;

/* Returns a static, human-readable name for an error code ("deadline expired").
 * Unknown codes give "unknown error". Never returns NULL. */
const char *dt_strerror(int rc);

/* Returns the last error message recorded by the calling thread: one line
 * naming the file, line, key, peer or rank involved ("config.ini:12: key
 * optim.lr: not a number"). Empty string if nothing was recorded. The storage
 * is thread-local and valid until the next failing call on this thread. Each
 * handle is used by one thread at a time, so this doubles as the per-handle
 * message of the design. */
const char *dt_errmsg(void);

/* Returns DT_VERSION_STRING. */
const char *dt_version(void);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_H */
