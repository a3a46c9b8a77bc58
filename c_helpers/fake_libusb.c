/* fake_libusb: the libusb-1.0 API subset used by python-libusb1 and the speck.usbgpu async helper, answered by
 * Python device models (speck.usbgpu.sim) through the operations table of fake_libusb.h.
 *
 * Written from the libusb-1.0 public API documentation: the structs below reproduce the public layouts of
 * libusb.h (device/config/interface/endpoint descriptors, libusb_transfer, libusb_version) because callers
 * (ctypes in usb1, the C helper) read and write those fields directly. Opaque types (context, device,
 * device handle) are private to this file.
 *
 * Model: synchronous transfers are submit + wait(that id); asynchronous transfers are submit, and
 * libusb_handle_events_* waits on the models that have transfers in flight and then runs the completion
 * callbacks of whatever completed, in completion order. A recursive lock serialises entry points (callbacks into
 * Python re-enter through fakeusb_complete on the same thread).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/types.h>

#include "fake_libusb.h"

#define API __attribute__((visibility("default")))

/* ---- public libusb constants and layouts (libusb.h) ---- */
enum {
    LIBUSB_SUCCESS = 0,
    LIBUSB_ERROR_IO = -1,
    LIBUSB_ERROR_INVALID_PARAM = -2,
    LIBUSB_ERROR_ACCESS = -3,
    LIBUSB_ERROR_NO_DEVICE = -4,
    LIBUSB_ERROR_NOT_FOUND = -5,
    LIBUSB_ERROR_BUSY = -6,
    LIBUSB_ERROR_TIMEOUT = -7,
    LIBUSB_ERROR_OVERFLOW = -8,
    LIBUSB_ERROR_PIPE = -9,
    LIBUSB_ERROR_INTERRUPTED = -10,
    LIBUSB_ERROR_NO_MEM = -11,
    LIBUSB_ERROR_NOT_SUPPORTED = -12,
    LIBUSB_ERROR_OTHER = -99,
};

enum {
    LIBUSB_TRANSFER_COMPLETED = 0,
    LIBUSB_TRANSFER_ERROR = 1,
    LIBUSB_TRANSFER_TIMED_OUT = 2,
    LIBUSB_TRANSFER_CANCELLED = 3,
    LIBUSB_TRANSFER_STALL = 4,
    LIBUSB_TRANSFER_NO_DEVICE = 5,
    LIBUSB_TRANSFER_OVERFLOW = 6,
};

enum {
    LIBUSB_TRANSFER_TYPE_CONTROL = 0,
    LIBUSB_TRANSFER_TYPE_BULK = 2,
    LIBUSB_TRANSFER_TYPE_INTERRUPT = 3,
};

#define LIBUSB_TRANSFER_FREE_BUFFER 2
#define LIBUSB_TRANSFER_FREE_TRANSFER 4

struct libusb_device_descriptor {
    uint8_t bLength;
    uint8_t bDescriptorType;
    uint16_t bcdUSB;
    uint8_t bDeviceClass;
    uint8_t bDeviceSubClass;
    uint8_t bDeviceProtocol;
    uint8_t bMaxPacketSize0;
    uint16_t idVendor;
    uint16_t idProduct;
    uint16_t bcdDevice;
    uint8_t iManufacturer;
    uint8_t iProduct;
    uint8_t iSerialNumber;
    uint8_t bNumConfigurations;
};

struct libusb_endpoint_descriptor {
    uint8_t bLength;
    uint8_t bDescriptorType;
    uint8_t bEndpointAddress;
    uint8_t bmAttributes;
    uint16_t wMaxPacketSize;
    uint8_t bInterval;
    uint8_t bRefresh;
    uint8_t bSynchAddress;
    const unsigned char *extra;
    int extra_length;
};

struct libusb_interface_descriptor {
    uint8_t bLength;
    uint8_t bDescriptorType;
    uint8_t bInterfaceNumber;
    uint8_t bAlternateSetting;
    uint8_t bNumEndpoints;
    uint8_t bInterfaceClass;
    uint8_t bInterfaceSubClass;
    uint8_t bInterfaceProtocol;
    uint8_t iInterface;
    const struct libusb_endpoint_descriptor *endpoint;
    const unsigned char *extra;
    int extra_length;
};

struct libusb_interface {
    const struct libusb_interface_descriptor *altsetting;
    int num_altsetting;
};

struct libusb_config_descriptor {
    uint8_t bLength;
    uint8_t bDescriptorType;
    uint16_t wTotalLength;
    uint8_t bNumInterfaces;
    uint8_t bConfigurationValue;
    uint8_t iConfiguration;
    uint8_t bmAttributes;
    uint8_t MaxPower;
    const struct libusb_interface *interface;
    const unsigned char *extra;
    int extra_length;
};

struct libusb_iso_packet_descriptor {
    unsigned int length;
    unsigned int actual_length;
    int status;
};

struct libusb_transfer;
typedef void (*libusb_transfer_cb_fn)(struct libusb_transfer *transfer);

struct libusb_transfer {
    struct libusb_device_handle *dev_handle;
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
    struct libusb_iso_packet_descriptor iso_packet_desc[];
};

struct libusb_version {
    uint16_t major;
    uint16_t minor;
    uint16_t micro;
    uint16_t nano;
    const char *rc;
    const char *describe;
};

/* ---- private state ---- */
#define MAX_DEVICES 64
#define MAX_CONFIGS 8

struct libusb_context {
    int is_default;
};

struct libusb_device {
    int refcount;
    int generation;
    int index;
    uint8_t bus, address;
    int speed;
    unsigned char device_descriptor[18];
    unsigned char *configs;
    int n_configs;
    int config_offset[MAX_CONFIGS];
    int config_length[MAX_CONFIGS];
    int current_config;
    unsigned claimed; /* interfaces claimed through any handle (usbfs allows one claimer) */
};

struct libusb_device_handle {
    struct libusb_device *dev;
    unsigned claimed;
};

enum { XFER_IDLE = 0, XFER_INFLIGHT = 1, XFER_DONE = 2 };

struct fake_itransfer {
    struct fake_itransfer *next; /* in g_inflight or g_done */
    int state;
    int dev;
    int generation;
    int id;
    struct libusb_transfer pub; /* last: has a flexible array member */
};

struct sync_wait {
    struct sync_wait *next;
    int dev, id, done, status, actual;
    unsigned char *in_buf;
    int in_capacity;
};

static pthread_mutex_t g_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static struct fakeusb_ops g_ops;
static int g_have_ops;
static int g_generation = 1;
static struct libusb_device *g_devices[MAX_DEVICES];
static int g_n_devices;
static struct fake_itransfer *g_inflight;
static struct fake_itransfer *g_done_head, *g_done_tail;
static struct sync_wait *g_sync;
static struct libusb_context g_default_context = {1};
static int g_default_context_refs;
static int g_live_transfers, g_open_handles, g_live_contexts, g_null_context_event_calls;

#define LOCK() pthread_mutex_lock(&g_lock)
#define UNLOCK() pthread_mutex_unlock(&g_lock)

static struct fake_itransfer *itransfer_of(struct libusb_transfer *t) {
    return (struct fake_itransfer *)((char *)t - offsetof(struct fake_itransfer, pub));
}

static int device_alive(const struct libusb_device *dev) {
    return dev && g_have_ops && dev->generation == g_generation && g_ops.connected(dev->index) > 0;
}

static int handle_alive(const struct libusb_device_handle *h) { return h && device_alive(h->dev); }

/* Hot paths (transfers) only check that the device belongs to the current installation; whether it is still
 * plugged in is answered by ops->submit / ops->wait returning LIBUSB_ERROR_NO_DEVICE, saving a callback. */
static int handle_current(const struct libusb_device_handle *h) {
    return h && g_have_ops && h->dev->generation == g_generation;
}

static unsigned timeval_ms(const struct timeval *tv) {
    if (!tv) return 60000; /* "block": one minute of model time, then the caller loops */
    long long ms = (long long)tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000;
    return ms < 0 ? 0 : (unsigned)ms;
}

static int status_to_error(int status) {
    switch (status) {
    case LIBUSB_TRANSFER_COMPLETED: return LIBUSB_SUCCESS;
    case LIBUSB_TRANSFER_TIMED_OUT: return LIBUSB_ERROR_TIMEOUT;
    case LIBUSB_TRANSFER_STALL: return LIBUSB_ERROR_PIPE;
    case LIBUSB_TRANSFER_NO_DEVICE: return LIBUSB_ERROR_NO_DEVICE;
    case LIBUSB_TRANSFER_OVERFLOW: return LIBUSB_ERROR_OVERFLOW;
    default: return LIBUSB_ERROR_IO;
    }
}

/* ---- registration side (fake_libusb.h) ---- */
static void device_unref_locked(struct libusb_device *dev) {
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

/* ---- enumeration and descriptors ---- */
API ssize_t libusb_get_device_list(struct libusb_context *ctx, struct libusb_device ***list) {
    (void)ctx;
    if (!list) return LIBUSB_ERROR_INVALID_PARAM;
    LOCK();
    struct libusb_device **out = calloc((size_t)g_n_devices + 1, sizeof *out);
    if (!out) { UNLOCK(); return LIBUSB_ERROR_NO_MEM; }
    ssize_t n = 0;
    for (int i = 0; i < g_n_devices; i++) {
        if (device_alive(g_devices[i])) {
            g_devices[i]->refcount++;
            out[n++] = g_devices[i];
        }
    }
    *list = out;
    UNLOCK();
    return n;
}

API void libusb_free_device_list(struct libusb_device **list, int unref_devices) {
    if (!list) return;
    LOCK();
    if (unref_devices)
        for (struct libusb_device **p = list; *p; p++) device_unref_locked(*p);
    free(list);
    UNLOCK();
}

API struct libusb_device *libusb_ref_device(struct libusb_device *dev) {
    LOCK();
    dev->refcount++;
    UNLOCK();
    return dev;
}

API void libusb_unref_device(struct libusb_device *dev) {
    if (!dev) return;
    LOCK();
    device_unref_locked(dev);
    UNLOCK();
}

API int libusb_get_device_descriptor(struct libusb_device *dev, struct libusb_device_descriptor *desc) {
    const unsigned char *d = dev->device_descriptor;
    desc->bLength = d[0];
    desc->bDescriptorType = d[1];
    desc->bcdUSB = (uint16_t)(d[2] | d[3] << 8);
    desc->bDeviceClass = d[4];
    desc->bDeviceSubClass = d[5];
    desc->bDeviceProtocol = d[6];
    desc->bMaxPacketSize0 = d[7];
    desc->idVendor = (uint16_t)(d[8] | d[9] << 8);
    desc->idProduct = (uint16_t)(d[10] | d[11] << 8);
    desc->bcdDevice = (uint16_t)(d[12] | d[13] << 8);
    desc->iManufacturer = d[14];
    desc->iProduct = d[15];
    desc->iSerialNumber = d[16];
    desc->bNumConfigurations = d[17];
    return 0;
}

/* One allocation owner per parsed configuration, so libusb_free_config_descriptor can release everything. */
struct parsed_config {
    struct libusb_config_descriptor desc; /* first: callers hold a pointer to it */
    unsigned char *raw;
    struct libusb_interface *interfaces;
    int n_interfaces;
};

#define MAX_ALTS 8
#define MAX_ENDPOINTS 16

static void free_parsed(struct parsed_config *pc) {
    if (!pc) return;
    for (int i = 0; i < pc->n_interfaces; i++) {
        struct libusb_interface_descriptor *alts = (struct libusb_interface_descriptor *)pc->interfaces[i].altsetting;
        for (int a = 0; alts && a < MAX_ALTS; a++) free((void *)alts[a].endpoint);
        free(alts);
    }
    free(pc->interfaces);
    free(pc->raw);
    free(pc);
}

/* Parse one wire-format configuration descriptor (config, interface, endpoint, and class/companion descriptors,
 * which become the `extra` bytes of whatever precedes them). */
static int parse_config(const unsigned char *src, int len, struct libusb_config_descriptor **out) {
    struct parsed_config *pc = calloc(1, sizeof *pc);
    if (!pc) return LIBUSB_ERROR_NO_MEM;
    pc->raw = malloc((size_t)len);
    if (!pc->raw) { free(pc); return LIBUSB_ERROR_NO_MEM; }
    memcpy(pc->raw, src, (size_t)len);
    const unsigned char *b = pc->raw;
    struct libusb_config_descriptor *c = &pc->desc;
    c->bLength = b[0];
    c->bDescriptorType = b[1];
    c->wTotalLength = (uint16_t)(b[2] | b[3] << 8);
    c->bNumInterfaces = b[4];
    c->bConfigurationValue = b[5];
    c->iConfiguration = b[6];
    c->bmAttributes = b[7];
    c->MaxPower = b[8];
    int n_if = b[4];
    pc->interfaces = calloc(n_if ? (size_t)n_if : 1, sizeof *pc->interfaces);
    int if_numbers[32];
    if (!pc->interfaces || n_if > 32) { free_parsed(pc); return LIBUSB_ERROR_NO_MEM; }
    struct libusb_interface_descriptor *cur_alt = NULL;
    struct libusb_endpoint_descriptor *cur_ep = NULL;
    const unsigned char **extra = &c->extra;
    int *extra_len = &c->extra_length;
    int off = b[0];
    while (off + 2 <= len) {
        int dlen = b[off], dtype = b[off + 1];
        if (dlen < 2 || off + dlen > len) { free_parsed(pc); return LIBUSB_ERROR_IO; }
        if (dtype == 4 && dlen >= 9) { /* interface */
            int number = b[off + 2], slot = -1;
            for (int i = 0; i < pc->n_interfaces; i++)
                if (if_numbers[i] == number) slot = i;
            if (slot < 0) {
                if (pc->n_interfaces >= n_if) { free_parsed(pc); return LIBUSB_ERROR_IO; }
                slot = pc->n_interfaces++;
                if_numbers[slot] = number;
                pc->interfaces[slot].altsetting = calloc(MAX_ALTS, sizeof(struct libusb_interface_descriptor));
                if (!pc->interfaces[slot].altsetting) { free_parsed(pc); return LIBUSB_ERROR_NO_MEM; }
            }
            struct libusb_interface *itf = &pc->interfaces[slot];
            if (itf->num_altsetting >= MAX_ALTS) { free_parsed(pc); return LIBUSB_ERROR_IO; }
            cur_alt = (struct libusb_interface_descriptor *)&itf->altsetting[itf->num_altsetting++];
            cur_alt->bLength = b[off];
            cur_alt->bDescriptorType = b[off + 1];
            cur_alt->bInterfaceNumber = b[off + 2];
            cur_alt->bAlternateSetting = b[off + 3];
            cur_alt->bNumEndpoints = 0; /* counted as endpoints are parsed */
            cur_alt->bInterfaceClass = b[off + 5];
            cur_alt->bInterfaceSubClass = b[off + 6];
            cur_alt->bInterfaceProtocol = b[off + 7];
            cur_alt->iInterface = b[off + 8];
            cur_alt->endpoint = calloc(MAX_ENDPOINTS, sizeof(struct libusb_endpoint_descriptor));
            if (!cur_alt->endpoint) { free_parsed(pc); return LIBUSB_ERROR_NO_MEM; }
            cur_ep = NULL;
            extra = &cur_alt->extra;
            extra_len = &cur_alt->extra_length;
        } else if (dtype == 5 && dlen >= 7 && cur_alt) { /* endpoint */
            if (cur_alt->bNumEndpoints >= MAX_ENDPOINTS) { free_parsed(pc); return LIBUSB_ERROR_IO; }
            cur_ep = (struct libusb_endpoint_descriptor *)&cur_alt->endpoint[cur_alt->bNumEndpoints++];
            cur_ep->bLength = b[off];
            cur_ep->bDescriptorType = b[off + 1];
            cur_ep->bEndpointAddress = b[off + 2];
            cur_ep->bmAttributes = b[off + 3];
            cur_ep->wMaxPacketSize = (uint16_t)(b[off + 4] | b[off + 5] << 8);
            cur_ep->bInterval = b[off + 6];
            extra = &cur_ep->extra;
            extra_len = &cur_ep->extra_length;
        } else { /* anything else (e.g. SuperSpeed endpoint companion) is extra bytes of what precedes it */
            if (!*extra) *extra = b + off;
            *extra_len += dlen;
        }
        off += dlen;
    }
    (void)cur_ep;
    c->interface = pc->interfaces;
    c->bNumInterfaces = (uint8_t)pc->n_interfaces; /* what was actually described */
    *out = &pc->desc;
    return 0;
}

API int libusb_get_config_descriptor(struct libusb_device *dev, uint8_t config_index,
                                     struct libusb_config_descriptor **config) {
    if (config_index >= dev->n_configs) return LIBUSB_ERROR_NOT_FOUND;
    return parse_config(dev->configs + dev->config_offset[config_index], dev->config_length[config_index], config);
}

API int libusb_get_config_descriptor_by_value(struct libusb_device *dev, uint8_t value,
                                              struct libusb_config_descriptor **config) {
    for (int i = 0; i < dev->n_configs; i++)
        if (dev->configs[dev->config_offset[i] + 5] == value) return libusb_get_config_descriptor(dev, (uint8_t)i, config);
    return LIBUSB_ERROR_NOT_FOUND;
}

API int libusb_get_active_config_descriptor(struct libusb_device *dev, struct libusb_config_descriptor **config) {
    if (dev->current_config == 0) return LIBUSB_ERROR_NOT_FOUND;
    return libusb_get_config_descriptor_by_value(dev, (uint8_t)dev->current_config, config);
}

API void libusb_free_config_descriptor(struct libusb_config_descriptor *config) {
    free_parsed((struct parsed_config *)config);
}

API uint8_t libusb_get_bus_number(struct libusb_device *dev) { return dev->bus; }
API uint8_t libusb_get_device_address(struct libusb_device *dev) { return dev->address; }
API uint8_t libusb_get_port_number(struct libusb_device *dev) { return (uint8_t)(dev->index + 1); }
API int libusb_get_port_numbers(struct libusb_device *dev, uint8_t *ports, int ports_len) {
    if (ports_len < 1) return LIBUSB_ERROR_OVERFLOW;
    ports[0] = (uint8_t)(dev->index + 1);
    return 1;
}
API struct libusb_device *libusb_get_parent(struct libusb_device *dev) { (void)dev; return NULL; }
API int libusb_get_device_speed(struct libusb_device *dev) { return dev->speed; }

API int libusb_get_max_packet_size(struct libusb_device *dev, unsigned char endpoint) {
    struct libusb_config_descriptor *c;
    int r = libusb_get_active_config_descriptor(dev, &c);
    if (r < 0) return r;
    int mps = LIBUSB_ERROR_NOT_FOUND;
    for (int i = 0; i < c->bNumInterfaces && mps < 0; i++)
        for (int a = 0; a < c->interface[i].num_altsetting && mps < 0; a++)
            for (int e = 0; e < c->interface[i].altsetting[a].bNumEndpoints; e++)
                if (c->interface[i].altsetting[a].endpoint[e].bEndpointAddress == endpoint) {
                    mps = c->interface[i].altsetting[a].endpoint[e].wMaxPacketSize & 0x7ff;
                    break;
                }
    libusb_free_config_descriptor(c);
    return mps;
}

API int libusb_get_max_iso_packet_size(struct libusb_device *dev, unsigned char endpoint) {
    return libusb_get_max_packet_size(dev, endpoint);
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
    return LIBUSB_ERROR_NOT_SUPPORTED; /* the transport detaches explicitly, as USB_PROTOCOL.md 1.2 orders */
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
