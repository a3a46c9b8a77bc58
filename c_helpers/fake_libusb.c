/* fake_libusb: the libusb-1.0 API subset used by python-libusb1 and the speck.usbgpu async helper, answered by
 * Python device models (speck.usbgpu.sim) through the operations table of fake_libusb.h.
 *
 * Written from the libusb-1.0 public API documentation: fake_libusb_internal.h reproduces the public layouts of
 * libusb.h (device/config/interface/endpoint descriptors, libusb_transfer, libusb_version) because callers
 * (ctypes in usb1, the C helper) read and write those fields directly; the opaque types (context, device,
 * device handle) are private to the fake. This file holds registration, contexts, device handles, transfers and
 * event handling; fake_libusb_descriptors.c holds enumeration and descriptors.
 *
 * Model: synchronous transfers are submit + wait(that id); asynchronous transfers are submit, and
 * libusb_handle_events_* waits on the models that have transfers in flight and then runs the completion
 * callbacks of whatever completed, in completion order. A recursive lock serialises entry points (callbacks into
 * Python re-enter through fakeusb_complete on the same thread).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fake_libusb_internal.h"

/* ---- shared state (declared in fake_libusb_internal.h) ---- */
pthread_mutex_t g_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
struct fakeusb_ops g_ops;
int g_have_ops;
int g_generation = 1;
struct libusb_device *g_devices[MAX_DEVICES];
int g_n_devices;
struct fake_itransfer *g_inflight;
struct fake_itransfer *g_done_head, *g_done_tail;
struct sync_wait *g_sync;
static struct libusb_context g_default_context = {1};
static int g_default_context_refs;
int g_live_transfers, g_open_handles, g_live_contexts, g_null_context_event_calls;

/* ---- registration side (fake_libusb.h) ---- */
void device_unref_locked(struct libusb_device *dev) {
    if (--dev->refcount == 0) {
        free(dev->configs);
        free(dev);
    }
}

API void fakeusb_set_ops(const struct fakeusb_ops *ops) {
    LOCK();
    for (int i = 0; i < g_n_devices; i++) device_unref_locked(g_devices[i]);
    g_n_devices = 0;
    g_generation++;
    if (ops) {
        g_ops = *ops;
        g_have_ops = 1;
    } else {
        memset(&g_ops, 0, sizeof g_ops);
        g_have_ops = 0;
    }
    /* Transfers of the previous installation can never complete through a model again. */
    while (g_inflight) {
        struct fake_itransfer *it = g_inflight;
        g_inflight = it->next;
        it->pub.status = LIBUSB_TRANSFER_NO_DEVICE;
        it->pub.actual_length = 0;
        it->state = XFER_DONE;
        it->next = NULL;
        if (g_done_tail) g_done_tail->next = it; else g_done_head = it;
        g_done_tail = it;
    }
    UNLOCK();
}

API int fakeusb_add_device(int bus, int address, int speed, const unsigned char *device_descriptor,
                           const unsigned char *configs, int configs_length) {
    if (!device_descriptor || configs_length < 0 || (configs_length && !configs)) return LIBUSB_ERROR_INVALID_PARAM;
    if (device_descriptor[0] != 18 || device_descriptor[1] != 1) return LIBUSB_ERROR_INVALID_PARAM;
    LOCK();
    if (g_n_devices >= MAX_DEVICES) { UNLOCK(); return LIBUSB_ERROR_NO_MEM; }
    struct libusb_device *dev = calloc(1, sizeof *dev);
    if (!dev) { UNLOCK(); return LIBUSB_ERROR_NO_MEM; }
    dev->configs = malloc(configs_length ? (size_t)configs_length : 1);
    if (!dev->configs) { free(dev); UNLOCK(); return LIBUSB_ERROR_NO_MEM; }
    memcpy(dev->configs, configs, (size_t)configs_length);
    /* Split the concatenated configuration descriptors by wTotalLength. */
    int off = 0;
    while (off + 9 <= configs_length && dev->n_configs < MAX_CONFIGS) {
        int total = configs[off + 2] | (configs[off + 3] << 8);
        if (configs[off + 1] != 2 || total < 9 || off + total > configs_length) break;
        dev->config_offset[dev->n_configs] = off;
        dev->config_length[dev->n_configs] = total;
        dev->n_configs++;
        off += total;
    }
    if (off != configs_length || dev->n_configs != device_descriptor[17]) {
        free(dev->configs);
        free(dev);
        UNLOCK();
        return LIBUSB_ERROR_INVALID_PARAM;
    }
    memcpy(dev->device_descriptor, device_descriptor, 18);
    dev->refcount = 1; /* the registry's reference */
    dev->generation = g_generation;
    dev->index = g_n_devices;
    dev->bus = (uint8_t)bus;
    dev->address = (uint8_t)address;
    dev->speed = speed;
    dev->current_config = dev->n_configs ? configs[5] : 0; /* the kernel configures the first one */
    g_devices[g_n_devices++] = dev;
    int index = dev->index;
    UNLOCK();
    return index;
}

API void fakeusb_complete(int dev, int transfer_id, int status, int actual_length, const unsigned char *data,
                          int data_length) {
    LOCK();
    for (struct sync_wait *w = g_sync; w; w = w->next) {
        if (w->dev == dev && w->id == transfer_id && !w->done) {
            w->done = 1;
            w->status = status;
            int n = data_length < w->in_capacity ? data_length : w->in_capacity;
            if (n > 0 && data && w->in_buf) memcpy(w->in_buf, data, (size_t)n);
            w->actual = actual_length;
            UNLOCK();
            return;
        }
    }
    struct fake_itransfer **pp = &g_inflight;
    while (*pp) {
        struct fake_itransfer *it = *pp;
        if (it->dev == dev && it->id == transfer_id && it->generation == g_generation) {
            *pp = it->next;
            struct libusb_transfer *t = &it->pub;
            int is_control = t->type == LIBUSB_TRANSFER_TYPE_CONTROL;
            unsigned char *dst = t->buffer ? t->buffer + (is_control ? 8 : 0) : NULL;
            int capacity = t->length - (is_control ? 8 : 0);
            int n = data_length < capacity ? data_length : capacity;
            if (n > 0 && data && dst) memcpy(dst, data, (size_t)n);
            t->status = status;
            t->actual_length = actual_length;
            it->state = XFER_DONE;
            it->next = NULL;
            if (g_done_tail) g_done_tail->next = it; else g_done_head = it;
            g_done_tail = it;
            UNLOCK();
            return;
        }
        pp = &it->next;
    }
    UNLOCK(); /* unknown or already-cancelled id: nothing waits for it */
}

API int fakeusb_inflight_count(void) {
    LOCK();
    int n = 0;
    for (struct fake_itransfer *it = g_inflight; it; it = it->next) n++;
    for (struct fake_itransfer *it = g_done_head; it; it = it->next) n++;
    UNLOCK();
    return n;
}

API int fakeusb_live_transfers(void) { return g_live_transfers; }
API int fakeusb_open_handles(void) { return g_open_handles; }
API int fakeusb_live_contexts(void) { return g_live_contexts; }
API int fakeusb_null_context_event_calls(void) { return g_null_context_event_calls; }

/* ---- library, context, logging ---- */
static const struct libusb_version g_version = {1, 0, 27, 0, "", "speck fake libusb (simulator)"};

API const struct libusb_version *libusb_get_version(void) { return &g_version; }

API int libusb_init(struct libusb_context **ctx) {
    LOCK();
    if (!ctx) {
        g_default_context_refs++;
        UNLOCK();
        return 0;
    }
    struct libusb_context *c = calloc(1, sizeof *c);
    if (!c) { UNLOCK(); return LIBUSB_ERROR_NO_MEM; }
    g_live_contexts++;
    *ctx = c;
    UNLOCK();
    return 0;
}

API int libusb_init_context(struct libusb_context **ctx, const void *options, int num_options) {
    (void)options;
    (void)num_options; /* log level / no-discovery options do not change a simulated bus */
    return libusb_init(ctx);
}

API void libusb_exit(struct libusb_context *ctx) {
    LOCK();
    if (!ctx || ctx == &g_default_context) {
        if (g_default_context_refs > 0) g_default_context_refs--;
    } else {
        g_live_contexts--;
        free(ctx);
    }
    UNLOCK();
}

API void libusb_set_debug(struct libusb_context *ctx, int level) { (void)ctx; (void)level; }
API void libusb_set_log_cb(struct libusb_context *ctx, void *cb, int mode) { (void)ctx; (void)cb; (void)mode; }
API int libusb_set_option(struct libusb_context *ctx, int option, ...) { (void)ctx; (void)option; return 0; }
API int libusb_setlocale(const char *locale) { (void)locale; return 0; }

API int libusb_has_capability(uint32_t capability) {
    return capability == 0x0000 /* HAS_CAPABILITY */ || capability == 0x0101 /* SUPPORTS_DETACH_KERNEL_DRIVER */;
}

API const char *libusb_error_name(int code) {
    switch (code) {
    case LIBUSB_SUCCESS: return "LIBUSB_SUCCESS / LIBUSB_TRANSFER_COMPLETED";
    case LIBUSB_ERROR_IO: return "LIBUSB_ERROR_IO";
    case LIBUSB_ERROR_INVALID_PARAM: return "LIBUSB_ERROR_INVALID_PARAM";
    case LIBUSB_ERROR_ACCESS: return "LIBUSB_ERROR_ACCESS";
    case LIBUSB_ERROR_NO_DEVICE: return "LIBUSB_ERROR_NO_DEVICE";
    case LIBUSB_ERROR_NOT_FOUND: return "LIBUSB_ERROR_NOT_FOUND";
    case LIBUSB_ERROR_BUSY: return "LIBUSB_ERROR_BUSY";
    case LIBUSB_ERROR_TIMEOUT: return "LIBUSB_ERROR_TIMEOUT";
    case LIBUSB_ERROR_OVERFLOW: return "LIBUSB_ERROR_OVERFLOW";
    case LIBUSB_ERROR_PIPE: return "LIBUSB_ERROR_PIPE";
    case LIBUSB_ERROR_INTERRUPTED: return "LIBUSB_ERROR_INTERRUPTED";
    case LIBUSB_ERROR_NO_MEM: return "LIBUSB_ERROR_NO_MEM";
    case LIBUSB_ERROR_NOT_SUPPORTED: return "LIBUSB_ERROR_NOT_SUPPORTED";
    case LIBUSB_ERROR_OTHER: return "LIBUSB_ERROR_OTHER";
    case LIBUSB_TRANSFER_ERROR: return "LIBUSB_TRANSFER_ERROR";
    case LIBUSB_TRANSFER_TIMED_OUT: return "LIBUSB_TRANSFER_TIMED_OUT";
    case LIBUSB_TRANSFER_CANCELLED: return "LIBUSB_TRANSFER_CANCELLED";
    case LIBUSB_TRANSFER_STALL: return "LIBUSB_TRANSFER_STALL";
    case LIBUSB_TRANSFER_NO_DEVICE: return "LIBUSB_TRANSFER_NO_DEVICE";
    case LIBUSB_TRANSFER_OVERFLOW: return "LIBUSB_TRANSFER_OVERFLOW";
    default: return "**UNKNOWN**";
    }
}

API const char *libusb_strerror(int code) {
    switch (code) {
    case LIBUSB_SUCCESS: return "Success";
    case LIBUSB_ERROR_IO: return "Input/Output Error";
    case LIBUSB_ERROR_INVALID_PARAM: return "Invalid parameter";
    case LIBUSB_ERROR_ACCESS: return "Access denied (insufficient permissions)";
    case LIBUSB_ERROR_NO_DEVICE: return "No such device (it may have been disconnected)";
    case LIBUSB_ERROR_NOT_FOUND: return "Entity not found";
    case LIBUSB_ERROR_BUSY: return "Resource busy";
    case LIBUSB_ERROR_TIMEOUT: return "Operation timed out";
    case LIBUSB_ERROR_OVERFLOW: return "Overflow";
    case LIBUSB_ERROR_PIPE: return "Pipe error";
    case LIBUSB_ERROR_INTERRUPTED: return "System call interrupted (perhaps due to signal)";
    case LIBUSB_ERROR_NO_MEM: return "Insufficient memory";
    case LIBUSB_ERROR_NOT_SUPPORTED: return "Operation not supported or unimplemented on this platform";
    default: return "Other error";
    }
}

/* ---- device handles ---- */
API int libusb_open(struct libusb_device *dev, struct libusb_device_handle **handle) {
    LOCK();
    if (!device_alive(dev)) { UNLOCK(); return LIBUSB_ERROR_NO_DEVICE; }
    struct libusb_device_handle *h = calloc(1, sizeof *h);
    if (!h) { UNLOCK(); return LIBUSB_ERROR_NO_MEM; }
    dev->refcount++;
    h->dev = dev;
    g_open_handles++;
    *handle = h;
    UNLOCK();
    return 0;
}

API void libusb_close(struct libusb_device_handle *handle) {
    if (!handle) return;
    LOCK();
    handle->dev->claimed &= ~handle->claimed; /* closing releases what this handle claimed */
    device_unref_locked(handle->dev);
    g_open_handles--;
    free(handle);
    UNLOCK();
}

API struct libusb_device *libusb_get_device(struct libusb_device_handle *handle) { return handle->dev; }

API struct libusb_device_handle *libusb_open_device_with_vid_pid(struct libusb_context *ctx, uint16_t vid,
                                                                  uint16_t pid) {
    (void)ctx;
    struct libusb_device_handle *h = NULL;
    LOCK();
    for (int i = 0; i < g_n_devices && !h; i++) {
        const unsigned char *d = g_devices[i]->device_descriptor;
        if (device_alive(g_devices[i]) && (d[8] | d[9] << 8) == vid && (d[10] | d[11] << 8) == pid)
            if (libusb_open(g_devices[i], &h) < 0) h = NULL;
    }
    UNLOCK();
    return h;
}

API int libusb_wrap_sys_device(struct libusb_context *ctx, intptr_t sys_dev, struct libusb_device_handle **h) {
    (void)ctx; (void)sys_dev; (void)h;
    return LIBUSB_ERROR_NOT_SUPPORTED;
}

static int control_op(struct libusb_device_handle *h, int op, int a, int b) {
    LOCK();
    int r = handle_alive(h) ? g_ops.control_op(h->dev->index, op, a, b) : LIBUSB_ERROR_NO_DEVICE;
    UNLOCK();
    return r;
}

API int libusb_get_configuration(struct libusb_device_handle *h, int *config) {
    if (!handle_alive(h)) return LIBUSB_ERROR_NO_DEVICE;
    *config = h->dev->current_config;
    return 0;
}

API int libusb_set_configuration(struct libusb_device_handle *h, int configuration) {
    if (h && h->dev->claimed) return LIBUSB_ERROR_BUSY; /* usbfs refuses while interfaces are claimed */
    int r = control_op(h, FAKEUSB_OP_SET_CONFIGURATION, configuration, 0);
    if (r == 0) h->dev->current_config = configuration < 0 ? 0 : configuration;
    return r;
}

API int libusb_kernel_driver_active(struct libusb_device_handle *h, int interface_number) {
    LOCK();
    int r = handle_alive(h) ? g_ops.kernel_driver_active(h->dev->index, interface_number) : LIBUSB_ERROR_NO_DEVICE;
    UNLOCK();
    return r;
}

API int libusb_detach_kernel_driver(struct libusb_device_handle *h, int interface_number) {
    int active = libusb_kernel_driver_active(h, interface_number);
    if (active < 0) return active;
    if (!active) return LIBUSB_ERROR_NOT_FOUND;
    return control_op(h, FAKEUSB_OP_DETACH_KERNEL_DRIVER, interface_number, 0);
}

API int libusb_attach_kernel_driver(struct libusb_device_handle *h, int interface_number) {
    return control_op(h, FAKEUSB_OP_ATTACH_KERNEL_DRIVER, interface_number, 0);
}

API int libusb_set_auto_detach_kernel_driver(struct libusb_device_handle *h, int enable) {
    (void)h; (void)enable;
    return LIBUSB_ERROR_NOT_SUPPORTED; /* the transport detaches explicitly, as packages/usbgpu/PROTOCOL.md 1.2 orders */
}

API int libusb_claim_interface(struct libusb_device_handle *h, int interface_number) {
    if (interface_number < 0 || interface_number > 31) return LIBUSB_ERROR_INVALID_PARAM;
    int active = libusb_kernel_driver_active(h, interface_number);
    if (active < 0) return active;
    if (active) return LIBUSB_ERROR_BUSY; /* a kernel driver owns it */
    unsigned bit = 1u << interface_number;
    LOCK();
    if ((h->dev->claimed & bit) && !(h->claimed & bit)) { UNLOCK(); return LIBUSB_ERROR_BUSY; } /* another handle */
    h->claimed |= bit;
    h->dev->claimed |= bit;
    UNLOCK();
    return 0;
}

API int libusb_release_interface(struct libusb_device_handle *h, int interface_number) {
    if (interface_number < 0 || interface_number > 31) return LIBUSB_ERROR_INVALID_PARAM;
    if (!(h->claimed & (1u << interface_number))) return LIBUSB_ERROR_NOT_FOUND;
    LOCK();
    h->claimed &= ~(1u << interface_number);
    h->dev->claimed &= ~(1u << interface_number);
    UNLOCK();
    return handle_alive(h) ? 0 : LIBUSB_ERROR_NO_DEVICE;
}

API int libusb_set_interface_alt_setting(struct libusb_device_handle *h, int interface_number, int alt) {
    if (interface_number < 0 || interface_number > 31 || !(h->claimed & (1u << interface_number)))
        return LIBUSB_ERROR_NOT_FOUND;
    return control_op(h, FAKEUSB_OP_SET_ALT_SETTING, interface_number, alt);
}

API int libusb_clear_halt(struct libusb_device_handle *h, unsigned char endpoint) {
    return control_op(h, FAKEUSB_OP_CLEAR_HALT, endpoint, 0);
}

API int libusb_reset_device(struct libusb_device_handle *h) { return control_op(h, FAKEUSB_OP_RESET, 0, 0); }

API int libusb_get_string_descriptor_ascii(struct libusb_device_handle *h, uint8_t index, unsigned char *data,
                                           int length) {
    if (index == 0) return LIBUSB_ERROR_INVALID_PARAM;
    LOCK();
    int r = handle_alive(h) ? g_ops.get_string(h->dev->index, index, data, length) : LIBUSB_ERROR_NO_DEVICE;
    UNLOCK();
    return r;
}

/* ---- synchronous transfers: submit + wait(that id) ---- */
static int sync_transfer(struct libusb_device_handle *h, int kind, int endpoint, const unsigned char *setup,
                         const unsigned char *out, int out_len, unsigned char *in_buf, int in_len,
                         unsigned int timeout, int *actual) {
    if (actual) *actual = 0;
    LOCK();
    if (!handle_current(h)) { UNLOCK(); return LIBUSB_ERROR_NO_DEVICE; }
    int dev = h->dev->index;
    int id = g_ops.submit(dev, kind, endpoint, setup, out, out_len, in_len, timeout);
    if (id < 0) { UNLOCK(); return id; }
    struct sync_wait w = {g_sync, dev, id, 0, 0, 0, in_buf, in_len};
    g_sync = &w;
    /* libusb's timeout 0 means "no timeout": wait in one-minute slices of model time. */
    unsigned slice = timeout ? timeout + 1 : 60000;
    int r = 0, idle_slices = 0;
    while (!w.done) {
        r = g_ops.wait(dev, &id, 1, slice);
        if (r < 0) break;
        /* A model must time its transfers out itself; if one does not, give up rather than hang the caller. */
        idle_slices = r == 0 ? idle_slices + 1 : 0;
        if (!w.done && timeout && idle_slices >= 3) { r = LIBUSB_ERROR_TIMEOUT; break; }
    }
    /* unlink (the record lives on this stack frame) */
    for (struct sync_wait **pp = &g_sync; *pp; pp = &(*pp)->next)
        if (*pp == &w) { *pp = w.next; break; }
    if (r < 0 && !w.done) {
        if (r != LIBUSB_ERROR_NO_DEVICE && handle_current(h)) g_ops.cancel(dev, id);
        UNLOCK();
        return r;
    }
    UNLOCK();
    if (actual) *actual = w.actual;
    if (w.status != LIBUSB_TRANSFER_COMPLETED) return status_to_error(w.status);
    return kind == FAKEUSB_KIND_CONTROL ? w.actual : 0;
}

API int libusb_control_transfer(struct libusb_device_handle *h, uint8_t request_type, uint8_t request,
                                uint16_t value, uint16_t index, unsigned char *data, uint16_t length,
                                unsigned int timeout) {
    unsigned char setup[8] = {request_type, request, (unsigned char)(value & 0xff), (unsigned char)(value >> 8),
                              (unsigned char)(index & 0xff), (unsigned char)(index >> 8),
                              (unsigned char)(length & 0xff), (unsigned char)(length >> 8)};
    if (length && !data) return LIBUSB_ERROR_INVALID_PARAM;
    if (request_type & 0x80)
        return sync_transfer(h, FAKEUSB_KIND_CONTROL, 0, setup, NULL, 0, data, length, timeout, NULL);
    return sync_transfer(h, FAKEUSB_KIND_CONTROL, 0, setup, data, length, NULL, 0, timeout, NULL);
}

API int libusb_bulk_transfer(struct libusb_device_handle *h, unsigned char endpoint, unsigned char *data,
                             int length, int *transferred, unsigned int timeout) {
    if (length < 0 || (length && !data)) return LIBUSB_ERROR_INVALID_PARAM;
    if (endpoint & 0x80)
        return sync_transfer(h, FAKEUSB_KIND_BULK, endpoint, NULL, NULL, 0, data, length, timeout, transferred);
    return sync_transfer(h, FAKEUSB_KIND_BULK, endpoint, NULL, data, length, NULL, 0, timeout, transferred);
}

API int libusb_interrupt_transfer(struct libusb_device_handle *h, unsigned char endpoint, unsigned char *data,
                                  int length, int *transferred, unsigned int timeout) {
    return libusb_bulk_transfer(h, endpoint, data, length, transferred, timeout);
}

/* ---- asynchronous transfers ---- */
API struct libusb_transfer *libusb_alloc_transfer(int iso_packets) {
    if (iso_packets < 0) return NULL;
    size_t size = sizeof(struct fake_itransfer) + (size_t)iso_packets * sizeof(struct libusb_iso_packet_descriptor);
    struct fake_itransfer *it = calloc(1, size);
    if (!it) return NULL;
    it->pub.num_iso_packets = iso_packets;
    LOCK();
    g_live_transfers++;
    UNLOCK();
    return &it->pub;
}

API void libusb_free_transfer(struct libusb_transfer *t) {
    if (!t) return;
    struct fake_itransfer *it = itransfer_of(t);
    /* Freeing an in-flight transfer is a caller bug libusb does not survive either; keep the memory alive so
     * the simulator cannot scribble over freed memory, and let leak counters show it. */
    if (it->state != XFER_IDLE) return;
    if ((t->flags & LIBUSB_TRANSFER_FREE_BUFFER) && t->buffer) free(t->buffer);
    LOCK();
    g_live_transfers--;
    UNLOCK();
    free(it);
}

API int libusb_submit_transfer(struct libusb_transfer *t) {
    struct fake_itransfer *it = itransfer_of(t);
    LOCK();
    if (it->state != XFER_IDLE) { UNLOCK(); return LIBUSB_ERROR_BUSY; }
    struct libusb_device_handle *h = t->dev_handle;
    if (!h) { UNLOCK(); return LIBUSB_ERROR_INVALID_PARAM; }
    if (!handle_current(h)) { UNLOCK(); return LIBUSB_ERROR_NO_DEVICE; }
    int dev = h->dev->index, id;
    if (t->type == LIBUSB_TRANSFER_TYPE_CONTROL) {
        if (t->length < 8 || !t->buffer) { UNLOCK(); return LIBUSB_ERROR_INVALID_PARAM; }
        int wlength = t->buffer[6] | t->buffer[7] << 8;
        if (t->length < 8 + wlength) { UNLOCK(); return LIBUSB_ERROR_INVALID_PARAM; }
        if (t->buffer[0] & 0x80)
            id = g_ops.submit(dev, FAKEUSB_KIND_CONTROL, 0, t->buffer, NULL, 0, wlength, t->timeout);
        else
            id = g_ops.submit(dev, FAKEUSB_KIND_CONTROL, 0, t->buffer, t->buffer + 8, wlength, 0, t->timeout);
    } else if (t->type == LIBUSB_TRANSFER_TYPE_BULK || t->type == LIBUSB_TRANSFER_TYPE_INTERRUPT) {
        if (t->length < 0 || (t->length && !t->buffer)) { UNLOCK(); return LIBUSB_ERROR_INVALID_PARAM; }
        if (t->endpoint & 0x80)
            id = g_ops.submit(dev, FAKEUSB_KIND_BULK, t->endpoint, NULL, NULL, 0, t->length, t->timeout);
        else
            id = g_ops.submit(dev, FAKEUSB_KIND_BULK, t->endpoint, NULL, t->buffer, t->length, 0, t->timeout);
    } else {
        UNLOCK();
        return LIBUSB_ERROR_NOT_SUPPORTED;
    }
    if (id < 0) { UNLOCK(); return id; }
    it->state = XFER_INFLIGHT;
    it->dev = dev;
    it->generation = g_generation;
    it->id = id;
    it->next = g_inflight;
    g_inflight = it;
    UNLOCK();
    return 0;
}

/* Complete (locally, with NO_DEVICE) in-flight transfers no model will answer for: those of an earlier
 * installation, and, with dev >= 0, those of a device whose model reported it unplugged. */
static void reap_locked(int dev) {
    struct fake_itransfer **pp = &g_inflight;
    while (*pp) {
        struct fake_itransfer *it = *pp;
        int dead = it->generation != g_generation || !g_have_ops || it->dev == dev;
        if (!dead) { pp = &it->next; continue; }
        *pp = it->next;
        it->pub.status = LIBUSB_TRANSFER_NO_DEVICE;
        it->pub.actual_length = 0;
        it->state = XFER_DONE;
        it->next = NULL;
        if (g_done_tail) g_done_tail->next = it; else g_done_head = it;
        g_done_tail = it;
    }
}

API int libusb_cancel_transfer(struct libusb_transfer *t) {
    struct fake_itransfer *it = itransfer_of(t);
    LOCK();
    if (it->state != XFER_INFLIGHT) { UNLOCK(); return LIBUSB_ERROR_NOT_FOUND; }
    int r = 0;
    if (it->generation == g_generation && g_have_ops) r = g_ops.cancel(it->dev, it->id);
    if (r == LIBUSB_ERROR_NO_DEVICE || it->generation != g_generation || !g_have_ops) {
        reap_locked(r == LIBUSB_ERROR_NO_DEVICE ? it->dev : -1);
        r = 0;
    }
    UNLOCK();
    return r < 0 ? r : 0;
}

/* Run completion callbacks in completion order; returns how many ran. The lock is dropped around each
 * callback because callbacks may resubmit, free or cancel transfers. */
static int run_callbacks(void) {
    int ran = 0;
    for (;;) {
        LOCK();
        struct fake_itransfer *it = g_done_head;
        if (!it) { UNLOCK(); break; }
        g_done_head = it->next;
        if (!g_done_head) g_done_tail = NULL;
        it->next = NULL;
        it->state = XFER_IDLE;
        UNLOCK();
        struct libusb_transfer *t = &it->pub;
        uint8_t flags = t->flags;
        if (t->callback) t->callback(t);
        if (flags & LIBUSB_TRANSFER_FREE_TRANSFER) libusb_free_transfer(t);
        ran++;
    }
    return ran;
}

API int libusb_handle_events_timeout_completed(struct libusb_context *ctx, struct timeval *tv, int *completed) {
    if (!ctx) g_null_context_event_calls++; /* the helper must always pass its own context */
    if (completed && *completed) return 0;
    /* Completions recorded during synchronous waits or cancellation are delivered first. */
    if (run_callbacks()) return 0;
    unsigned timeout = timeval_ms(tv);
    int r = 0;
    LOCK();
    reap_locked(-1);
    if (!g_done_head) {
        /* Wait once on each model with transfers in flight; only the first may advance its clock by the full
         * timeout, the others just report what already completed. */
        int waited[MAX_DEVICES] = {0};
        int first = 1;
        for (;;) {
            int dev = -1;
            for (struct fake_itransfer *it = g_inflight; it; it = it->next)
                if (!waited[it->dev]) { dev = it->dev; break; }
            if (dev < 0) break;
            waited[dev] = 1;
            r = g_ops.wait(dev, NULL, -1, first ? timeout : 0);
            first = 0;
            if (r == LIBUSB_ERROR_NO_DEVICE) { /* unplugged: its transfers end with status NO_DEVICE */
                reap_locked(dev);
                r = 0;
            }
            if (r < 0) break;
        }
    }
    UNLOCK();
    run_callbacks();
    return r < 0 ? r : 0;
}

API int libusb_handle_events_timeout(struct libusb_context *ctx, struct timeval *tv) {
    return libusb_handle_events_timeout_completed(ctx, tv, NULL);
}
API int libusb_handle_events(struct libusb_context *ctx) {
    return libusb_handle_events_timeout_completed(ctx, NULL, NULL);
}
API int libusb_handle_events_completed(struct libusb_context *ctx, int *completed) {
    return libusb_handle_events_timeout_completed(ctx, NULL, completed);
}
API int libusb_handle_events_locked(struct libusb_context *ctx, struct timeval *tv) {
    return libusb_handle_events_timeout_completed(ctx, tv, NULL);
}

/* Event-loop locking and poll integration: there are no file descriptors in a simulated bus. */
API int libusb_try_lock_events(struct libusb_context *ctx) { (void)ctx; return 0; }
API void libusb_lock_events(struct libusb_context *ctx) { (void)ctx; }
API void libusb_unlock_events(struct libusb_context *ctx) { (void)ctx; }
API int libusb_event_handling_ok(struct libusb_context *ctx) { (void)ctx; return 1; }
API int libusb_event_handler_active(struct libusb_context *ctx) { (void)ctx; return 0; }
API void libusb_interrupt_event_handler(struct libusb_context *ctx) { (void)ctx; }
API void libusb_lock_event_waiters(struct libusb_context *ctx) { (void)ctx; }
API void libusb_unlock_event_waiters(struct libusb_context *ctx) { (void)ctx; }
API int libusb_wait_for_event(struct libusb_context *ctx, struct timeval *tv) { (void)ctx; (void)tv; return 1; }
API int libusb_get_next_timeout(struct libusb_context *ctx, struct timeval *tv) { (void)ctx; (void)tv; return 0; }
API int libusb_pollfds_handle_timeouts(struct libusb_context *ctx) { (void)ctx; return 1; }
API const void **libusb_get_pollfds(struct libusb_context *ctx) {
    (void)ctx;
    return calloc(1, sizeof(void *)); /* an empty, NULL-terminated list */
}
API void libusb_free_pollfds(const void **pollfds) { free((void *)pollfds); }
API void libusb_set_pollfd_notifiers(struct libusb_context *ctx, void *added, void *removed, void *user_data) {
    (void)ctx; (void)added; (void)removed; (void)user_data;
}
API int libusb_hotplug_register_callback(struct libusb_context *ctx, int events, int flags, int vendor_id,
                                         int product_id, int dev_class, void *cb, void *user_data, int *handle) {
    (void)ctx; (void)events; (void)flags; (void)vendor_id; (void)product_id; (void)dev_class; (void)cb;
    (void)user_data; (void)handle;
    return LIBUSB_ERROR_NOT_SUPPORTED;
}
API void libusb_hotplug_deregister_callback(struct libusb_context *ctx, int handle) { (void)ctx; (void)handle; }
