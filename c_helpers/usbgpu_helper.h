/* usbgpu_helper: pooled asynchronous bulk OUT submission for speck.usbgpu, on top of a libusb-1.0 resolved at
 * run time (dlopen/dlsym), so the build needs no libusb headers.
 *
 * Completions are recorded in C by the transfer callback; no Python runs inside libusb event handling. The
 * first failed or short completion is latched and reported by every later wait (sticky).
 */
#ifndef SPECK_USBGPU_HELPER_H
#define SPECK_USBGPU_HELPER_H

#include <stdint.h>

/* Bumped when the C API below changes; checked by speck.usbgpu.helper together with the package version. */
#define USBGPU_HELPER_ABI 2

/* Return codes beyond libusb's own negative libusb_error values. */
#define USBGPU_LATCHED (-1000)        /* an earlier transfer failed or came back short; see usbgpu_latched() */
#define USBGPU_WAIT_TIMEOUT (-1001)   /* the tag is still in flight after the wait's timeout */
#define USBGPU_NOT_LOADED (-1002)     /* usbgpu_load_libusb has not succeeded */
#define USBGPU_CLOSED (-1003)         /* the pool is closing or closed */
#define USBGPU_WAIT_INTERRUPTED (-1004) /* a signal interrupted the event loop: the caller runs its handlers, then waits again */

typedef struct usbgpu_pool usbgpu_pool;

/* What the latch holds: the first failed transfer's tag, libusb_transfer_status, and byte counts. */
typedef struct usbgpu_latch {
    int64_t tag;
    int status;
    int actual_length;
    int length;
    unsigned char endpoint;
} usbgpu_latch;

/* The package version this helper was compiled for (set by the build from speck.usbgpu._version). */
const char *usbgpu_helper_version(void);

/* Load libusb from `path` (once per process; a later call with another path fails). Returns 0 or -1 with a
 * message in err. */
int usbgpu_load_libusb(const char *path, char *err, int err_len);
const char *usbgpu_loaded_path(void);
/* libusb_error_name / libusb_strerror of the loaded library ("" when the library lacks them). */
const char *usbgpu_error_name(int code);
const char *usbgpu_strerror(int code);

/* A pool of reusable transfers bound to one libusb context and device handle (raw pointers from usb1). */
usbgpu_pool *usbgpu_pool_new(void *context, void *handle, int initial_transfers);
/* Submit a bulk OUT of `length` bytes from `buffer` (which must stay valid until the tag completes).
 * Returns a tag > 0, or a negative libusb_error / USBGPU_* code. Never latches. */
int64_t usbgpu_submit_bulk_out(usbgpu_pool *pool, unsigned char endpoint, unsigned char *buffer, int length,
                               unsigned int timeout_ms);
/* Pump events on the pool's own context until `tag` completes or timeout_ms passes. Returns 0, USBGPU_LATCHED
 * (also when the failure belongs to another tag), USBGPU_WAIT_TIMEOUT, USBGPU_WAIT_INTERRUPTED (a signal arrived:
 * returned at once so that Ctrl-C reaches Python without waiting out the timeout), or a negative libusb_error from
 * the event loop. */
int usbgpu_wait(usbgpu_pool *pool, int64_t tag, unsigned int timeout_ms);
/* 1 when the tag has completed (successfully or not), 0 while in flight, negative for a tag never issued. */
int usbgpu_is_done(usbgpu_pool *pool, int64_t tag);
/* 1 and *out filled when an error is latched, else 0. */
/* The smallest tag still in flight (every smaller tag has completed), or the next tag to be issued. */
int64_t usbgpu_oldest_inflight(usbgpu_pool *pool);
int usbgpu_latched(usbgpu_pool *pool, usbgpu_latch *out);
int usbgpu_inflight(usbgpu_pool *pool);
int usbgpu_pool_size(usbgpu_pool *pool);
/* Cancel every in-flight transfer and pump events until all have come back or timeout_ms passes; completions
 * from here on do not latch. Returns how many are still in flight. */
int usbgpu_cancel_all(usbgpu_pool *pool, unsigned int timeout_ms);
/* Free the pool's transfers. Transfers still in flight are deliberately leaked (freeing them would be a
 * use-after-free inside libusb); returns how many were leaked. */
int usbgpu_pool_free(usbgpu_pool *pool);

#endif
