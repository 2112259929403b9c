/*
 * dtrain/core.h — what every part of the public API shares: the export
 * macro, the version, the error codes with dt_strerror(), and the per-thread
 * last-error message dt_errmsg().
 *
 * The error model, for every public function of libdtrain: a function that
 * can fail returns int, DT_OK (0) on success or a negative DT_E* code, and
 * records one line in dt_errmsg() naming what was wrong (the argument, file,
 * line, key, peer or rank). Bad input — a NULL or inconsistent argument, a
 * malformed file, an impossible model — is an error code, never a crash:
 * the library does not exit() or abort(). Functions that cannot fail
 * (getters on a valid handle, destroy functions) return their value
 * directly; destroying NULL is a no-op.
 *
 * Ownership: a handle (dt_model *, dt_comm *, ...) belongs to the caller
 * from the create call that filled it until the matching destroy. Pointers
 * a function returns into a handle stay valid for the handle's life unless
 * its comment says otherwise. A handle is used by one thread at a time.
 *
 * This header is self-contained; include <dtrain.h> for the whole API.
 */
#ifndef DTRAIN_CORE_H
#define DTRAIN_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks a function libdtrain.so exports. The library is compiled with
 * hidden visibility, so everything not marked stays internal. */
#if defined(__GNUC__) || defined(__clang__)
#define DT_API __attribute__((visibility("default")))
#else
#define DT_API
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

/* Returns a static, human-readable name for an error code ("deadline
 * expired"). Unknown codes give "unknown error". Never returns NULL; the
 * string is owned by the library. */
DT_API const char *dt_strerror(int rc);

/* Returns the last error message recorded by the calling thread: one line
 * naming the file, line, key, peer, rank or argument involved
 * ("config.ini:12: key optim.lr: not a number", "model add: layer NULL").
 * Empty string if nothing was recorded. The storage is thread-local, owned
 * by the library and valid until the next failing call on this thread. Each
 * handle is used by one thread at a time, so this doubles as the per-handle
 * message of the design. Successful calls do not clear it. */
DT_API const char *dt_errmsg(void);

/* Returns DT_VERSION_STRING of the library actually linked (which may differ
 * from the header's if a newer libdtrain.so is installed). */
DT_API const char *dt_version(void);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CORE_H */
