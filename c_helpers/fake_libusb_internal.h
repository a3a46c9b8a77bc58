/* fake_libusb internals shared by fake_libusb.c and fake_libusb_descriptors.c: the public libusb-1.0 layouts the
 * callers read and write (from the libusb-1.0 API documentation), the private device/handle/transfer state, and the
 * shared globals (defined in fake_libusb.c). Include after defining _GNU_SOURCE. */
#ifndef SPECK_FAKE_LIBUSB_INTERNAL_H
#define SPECK_FAKE_LIBUSB_INTERNAL_H

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
#define INTERNAL __attribute__((visibility("hidden")))

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

INTERNAL extern pthread_mutex_t g_lock;
INTERNAL extern struct fakeusb_ops g_ops;
INTERNAL extern int g_have_ops;
INTERNAL extern int g_generation;
INTERNAL extern struct libusb_device *g_devices[MAX_DEVICES];
INTERNAL extern int g_n_devices;
INTERNAL extern struct fake_itransfer *g_inflight;
INTERNAL extern struct fake_itransfer *g_done_head, *g_done_tail;
INTERNAL extern struct sync_wait *g_sync;
INTERNAL extern int g_live_transfers, g_open_handles, g_live_contexts, g_null_context_event_calls;

#define LOCK() pthread_mutex_lock(&g_lock)
#define UNLOCK() pthread_mutex_unlock(&g_lock)

static inline struct fake_itransfer *itransfer_of(struct libusb_transfer *t) {
    return (struct fake_itransfer *)((char *)t - offsetof(struct fake_itransfer, pub));
}

static inline int device_alive(const struct libusb_device *dev) {
    return dev && g_have_ops && dev->generation == g_generation && g_ops.connected(dev->index) > 0;
}

static inline int handle_alive(const struct libusb_device_handle *h) { return h && device_alive(h->dev); }

/* Hot paths (transfers) only check that the device belongs to the current installation; whether it is still
 * plugged in is answered by ops->submit / ops->wait returning LIBUSB_ERROR_NO_DEVICE, saving a callback. */
static inline int handle_current(const struct libusb_device_handle *h) {
    return h && g_have_ops && h->dev->generation == g_generation;
}

static inline unsigned timeval_ms(const struct timeval *tv) {
    if (!tv) return 60000; /* "block": one minute of model time, then the caller loops */
    long long ms = (long long)tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000;
    return ms < 0 ? 0 : (unsigned)ms;
}

static inline int status_to_error(int status) {
    switch (status) {
    case LIBUSB_TRANSFER_COMPLETED: return LIBUSB_SUCCESS;
    case LIBUSB_TRANSFER_TIMED_OUT: return LIBUSB_ERROR_TIMEOUT;
    case LIBUSB_TRANSFER_STALL: return LIBUSB_ERROR_PIPE;
    case LIBUSB_TRANSFER_NO_DEVICE: return LIBUSB_ERROR_NO_DEVICE;
    case LIBUSB_TRANSFER_OVERFLOW: return LIBUSB_ERROR_OVERFLOW;
    default: return LIBUSB_ERROR_IO;
    }
}

INTERNAL void device_unref_locked(struct libusb_device *dev);

#endif
