/* usbgpu_helper: pooled asynchronous bulk OUT transfers for speck.usbgpu (see usbgpu_helper.h).
 *
 * libusb is resolved at run time from the path Python hands over (the libusb-package wheel's library, a system
 * libusb, or the simulator's fake libusb), so only the few public layouts and prototypes used here are declared,
 * following the libusb-1.0 API documentation. A pool is used from one thread at a time.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "usbgpu_helper.h"

#ifndef USBGPU_PACKAGE_VERSION
#error "USBGPU_PACKAGE_VERSION must be defined by the build (speck.usbgpu._version.__version__)"
#endif

/* ---- the public libusb-1.0 pieces this file touches ---- */
#define LIBUSB_TRANSFER_TYPE_BULK 2
#define LIBUSB_TRANSFER_COMPLETED 0
#define LIBUSB_ERROR_INVALID_PARAM (-2)
#define LIBUSB_ERROR_NOT_FOUND (-5)
#define LIBUSB_ERROR_INTERRUPTED (-10)
#define LIBUSB_ERROR_NO_MEM (-11)

struct libusb_transfer;
typedef void (*libusb_transfer_cb_fn)(struct libusb_transfer *transfer);

struct libusb_transfer {
    void *dev_handle;
    uint8_t flags;
    unsigned char endpoint;
    unsigned char type;
    unsigned int timeout;
    int status;
    int length;
    int actual_length;
    libusb_transfer_cb_fn callback;
    void *user_data;
    unsigned char *buffer;
    int num_iso_packets;
    /* iso packet descriptors follow; none are allocated here */
};

typedef struct libusb_transfer *(*alloc_transfer_fn)(int iso_packets);
typedef void (*free_transfer_fn)(struct libusb_transfer *transfer);
typedef int (*submit_transfer_fn)(struct libusb_transfer *transfer);
typedef int (*cancel_transfer_fn)(struct libusb_transfer *transfer);
typedef int (*handle_events_fn)(void *ctx, struct timeval *tv, int *completed);
typedef const char *(*error_text_fn)(int code);

static struct {
    void *lib;
    char path[4096];
    alloc_transfer_fn alloc_transfer;
    free_transfer_fn free_transfer;
    submit_transfer_fn submit_transfer;
    cancel_transfer_fn cancel_transfer;
    handle_events_fn handle_events_timeout_completed;
    error_text_fn error_name;
    error_text_fn strerror_;
} g;

const char *usbgpu_helper_version(void) { return USBGPU_PACKAGE_VERSION; }

int usbgpu_load_libusb(const char *path, char *err, int err_len) {
    if (g.lib) {
        if (strcmp(path, g.path) == 0) return 0;
        snprintf(err, (size_t)err_len, "libusb is already loaded from %s; one process can use only one libusb", g.path);
        return -1;
    }
    if (strlen(path) >= sizeof g.path) {
        snprintf(err, (size_t)err_len, "libusb path too long (%zu bytes)", strlen(path));
        return -1;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(err, (size_t)err_len, "dlopen(%s) failed: %s", path, dlerror());
        return -1;
    }
    static const char *const names[] = {"libusb_alloc_transfer", "libusb_free_transfer", "libusb_submit_transfer",
                                        "libusb_cancel_transfer", "libusb_handle_events_timeout_completed"};
    void *syms[5];
    for (int i = 0; i < 5; i++) {
        syms[i] = dlsym(lib, names[i]);
        if (!syms[i]) {
            snprintf(err, (size_t)err_len, "%s has no symbol %s (need libusb >= 1.0.9)", path, names[i]);
            dlclose(lib);
            return -1;
        }
    }
    g.alloc_transfer = (alloc_transfer_fn)syms[0];
    g.free_transfer = (free_transfer_fn)syms[1];
    g.submit_transfer = (submit_transfer_fn)syms[2];
    g.cancel_transfer = (cancel_transfer_fn)syms[3];
    g.handle_events_timeout_completed = (handle_events_fn)syms[4];
    g.error_name = (error_text_fn)dlsym(lib, "libusb_error_name");
    g.strerror_ = (error_text_fn)dlsym(lib, "libusb_strerror");
    strcpy(g.path, path);
    g.lib = lib;
    return 0;
}

const char *usbgpu_loaded_path(void) { return g.lib ? g.path : ""; }
const char *usbgpu_error_name(int code) { return g.error_name ? g.error_name(code) : ""; }
const char *usbgpu_strerror(int code) { return g.strerror_ ? g.strerror_(code) : ""; }

/* ---- the pool ---- */
struct slot {
    struct libusb_transfer *transfer;
    struct usbgpu_pool *pool;
    int64_t tag;
    int done; /* 1 while free (not in flight); the address doubles as libusb's `completed` flag */
};

struct usbgpu_pool {
    void *context;
    void *handle;
    struct slot **slots;
    int n_slots, capacity;
    int64_t next_tag;
    int inflight;
    int closing;
    int latched;
    usbgpu_latch latch;
};

static void on_complete(struct libusb_transfer *t) {
    /* Runs inside libusb's event handling: record only, never call out. */
    struct slot *s = (struct slot *)t->user_data;
    struct usbgpu_pool *p = s->pool;
    int failed = t->status != LIBUSB_TRANSFER_COMPLETED || t->actual_length != t->length;
    if (failed && !p->closing && !p->latched) {
        p->latched = 1;
        p->latch.tag = s->tag;
        p->latch.status = t->status;
        p->latch.actual_length = t->actual_length;
        p->latch.length = t->length;
        p->latch.endpoint = t->endpoint;
    }
    p->inflight--;
    s->done = 1;
}

static int add_slot(usbgpu_pool *p) {
    if (p->n_slots == p->capacity) {
        int cap = p->capacity ? p->capacity * 2 : 8;
        struct slot **grown = realloc(p->slots, (size_t)cap * sizeof *grown);
        if (!grown) return LIBUSB_ERROR_NO_MEM;
        p->slots = grown;
        p->capacity = cap;
    }
    struct slot *s = calloc(1, sizeof *s);
    if (!s) return LIBUSB_ERROR_NO_MEM;
    s->transfer = g.alloc_transfer(0);
    if (!s->transfer) {
        free(s);
        return LIBUSB_ERROR_NO_MEM;
    }
    s->pool = p;
    s->done = 1;
    p->slots[p->n_slots++] = s;
    return 0;
}

usbgpu_pool *usbgpu_pool_new(void *context, void *handle, int initial_transfers) {
    if (!g.lib || !context || !handle) return NULL; /* never the NULL (default) context */
    usbgpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->context = context;
    p->handle = handle;
    p->next_tag = 1;
    for (int i = 0; i < initial_transfers; i++) {
        if (add_slot(p) < 0) {
            usbgpu_pool_free(p);
            return NULL;
        }
    }
    return p;
}

int64_t usbgpu_submit_bulk_out(usbgpu_pool *p, unsigned char endpoint, unsigned char *buffer, int length,
                               unsigned int timeout_ms) {
    if (p->closing) return USBGPU_CLOSED;
    if (endpoint & 0x80 || length < 0 || (length && !buffer)) return LIBUSB_ERROR_INVALID_PARAM;
    struct slot *s = NULL;
    for (int i = 0; i < p->n_slots && !s; i++)
        if (p->slots[i]->done) s = p->slots[i];
    if (!s) {
        int r = add_slot(p); /* the pool grows to the deepest pipeline the driver uses, then stays */
        if (r < 0) return r;
        s = p->slots[p->n_slots - 1];
    }
    struct libusb_transfer *t = s->transfer;
    t->dev_handle = p->handle;
    t->flags = 0;
    t->endpoint = endpoint;
    t->type = LIBUSB_TRANSFER_TYPE_BULK;
    t->timeout = timeout_ms;
    t->status = 0;
    t->length = length;
    t->actual_length = 0;
    t->callback = on_complete;
    t->user_data = s;
    t->buffer = buffer;
    t->num_iso_packets = 0;
    s->tag = p->next_tag;
    s->done = 0;
    p->inflight++;
    int r = g.submit_transfer(t);
    if (r < 0) {
        s->done = 1;
        p->inflight--;
        return r;
    }
    return p->next_tag++;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static struct slot *inflight_slot(usbgpu_pool *p, int64_t tag) {
    for (int i = 0; i < p->n_slots; i++)
        if (p->slots[i]->tag == tag && !p->slots[i]->done) return p->slots[i];
    return NULL;
}

int usbgpu_is_done(usbgpu_pool *p, int64_t tag) {
    if (tag <= 0 || tag >= p->next_tag) return LIBUSB_ERROR_INVALID_PARAM;
    return inflight_slot(p, tag) ? 0 : 1;
}

int usbgpu_wait(usbgpu_pool *p, int64_t tag, unsigned int timeout_ms) {
    if (tag <= 0 || tag >= p->next_tag) return LIBUSB_ERROR_INVALID_PARAM;
    struct slot *s = inflight_slot(p, tag);
    double deadline = now_ms() + timeout_ms;
    while (s && !s->done) {
        double remaining = deadline - now_ms();
        if (remaining < 0) remaining = 0;
        struct timeval tv = {(time_t)(remaining / 1e3), (suseconds_t)((remaining - 1e3 * (long)(remaining / 1e3)) * 1e3)};
        int r = g.handle_events_timeout_completed(p->context, &tv, &s->done);
        if (r == LIBUSB_ERROR_INTERRUPTED && !s->done) return USBGPU_WAIT_INTERRUPTED;
        if (r < 0 && r != LIBUSB_ERROR_INTERRUPTED) return r;
        if (!s->done && remaining <= 0) return USBGPU_WAIT_TIMEOUT;
    }
    return p->latched ? USBGPU_LATCHED : 0;
}

int64_t usbgpu_oldest_inflight(usbgpu_pool *p) {
    int64_t oldest = p->next_tag;
    for (int i = 0; i < p->n_slots; i++)
        if (!p->slots[i]->done && p->slots[i]->tag < oldest) oldest = p->slots[i]->tag;
    return oldest;
}

int usbgpu_latched(usbgpu_pool *p, usbgpu_latch *out) {
    if (!p->latched) return 0;
    *out = p->latch;
    return 1;
}

int usbgpu_inflight(usbgpu_pool *p) { return p->inflight; }
int usbgpu_pool_size(usbgpu_pool *p) { return p->n_slots; }

int usbgpu_cancel_all(usbgpu_pool *p, unsigned int timeout_ms) {
    p->closing = 1;
    for (int i = 0; i < p->n_slots; i++)
        if (!p->slots[i]->done) g.cancel_transfer(p->slots[i]->transfer); /* NOT_FOUND: already completing */
    double deadline = now_ms() + timeout_ms;
    while (p->inflight > 0) {
        double remaining = deadline - now_ms();
        if (remaining < 0) remaining = 0;
        struct timeval tv = {(time_t)(remaining / 1e3), (suseconds_t)((remaining - 1e3 * (long)(remaining / 1e3)) * 1e3)};
        int r = g.handle_events_timeout_completed(p->context, &tv, NULL);
        if ((r < 0 && r != LIBUSB_ERROR_INTERRUPTED) || remaining <= 0) break;
    }
    return p->inflight;
}

int usbgpu_pool_free(usbgpu_pool *p) {
    if (!p) return 0;
    p->closing = 1;
    int leaked = 0;
    for (int i = 0; i < p->n_slots; i++) {
        struct slot *s = p->slots[i];
        if (s->done) {
            g.free_transfer(s->transfer);
            free(s);
        } else {
            p->slots[leaked++] = s; /* still owned by libusb: keep it and the pool its callback points to */
        }
    }
    p->n_slots = leaked;
    if (leaked == 0) {
        free(p->slots);
        free(p);
    }
    return leaked;
}
