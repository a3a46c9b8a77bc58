/* fake_libusb, enumeration and descriptors: the device list, device descriptors, and configuration descriptors
 * parsed from the wire-format bytes each model registered (see fake_libusb.c for the overview). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fake_libusb_internal.h"

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
