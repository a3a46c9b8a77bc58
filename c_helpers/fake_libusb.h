/* fake_libusb: a libusb-1.0 look-alike whose devices are Python models (speck.usbgpu.sim).
 *
 * The exported libusb_* functions follow the libusb-1.0 ABI closely enough for python-libusb1 (usb1) and the
 * speck.usbgpu async helper. Everything that reaches a device is forwarded through the operations table set by
 * fakeusb_set_ops(); the Python side (speck.usbgpu.sim.shim) fills it with cffi callbacks.
 *
 * This header declares only the registration side; it is also the text of fake_libusb.cdef.
 */
#ifndef SPECK_FAKE_LIBUSB_H
#define SPECK_FAKE_LIBUSB_H

#include <stdint.h>

/* The operations a device model provides. `dev` is the index given by fakeusb_add_device in the current
 * installation. Every function returns >= 0 on success or a negative libusb_error code. */
struct fakeusb_ops {
    int (*connected)(int dev);
    int (*get_string)(int dev, int index, unsigned char *buf, int length);
    int (*kernel_driver_active)(int dev, int interface_number);
    /* op: one of FAKEUSB_OP_*; a, b: its arguments */
    int (*control_op)(int dev, int op, int a, int b);
    /* kind: FAKEUSB_KIND_CONTROL or FAKEUSB_KIND_BULK; setup is 8 bytes or NULL; returns a transfer id >= 0 */
    int (*submit)(int dev, int kind, int endpoint, const unsigned char *setup, const unsigned char *out_data,
                  int out_length, int in_length, unsigned int timeout_ms);
    int (*cancel)(int dev, int transfer_id);
    /* Wait until one of ids[0..n_ids) completes (n_ids < 0: any pending) or timeout_ms of model time passes.
     * Reports each completion through fakeusb_complete() before returning; returns how many completed.
     * submit and wait return LIBUSB_ERROR_NO_DEVICE once the device is unplugged (transfers still in flight
     * then end with LIBUSB_TRANSFER_NO_DEVICE); `connected` is only asked outside the transfer paths. */
    int (*wait)(int dev, const int *ids, int n_ids, unsigned int timeout_ms);
};

#define FAKEUSB_OP_DETACH_KERNEL_DRIVER 1
#define FAKEUSB_OP_ATTACH_KERNEL_DRIVER 2
#define FAKEUSB_OP_RESET 3
#define FAKEUSB_OP_SET_CONFIGURATION 4
#define FAKEUSB_OP_SET_ALT_SETTING 5
#define FAKEUSB_OP_CLEAR_HALT 6

#define FAKEUSB_KIND_CONTROL 0
#define FAKEUSB_KIND_BULK 2

/* Install a new operations table and forget every device of the previous installation (devices and handles
 * still referenced from an earlier installation answer LIBUSB_ERROR_NO_DEVICE from then on). */
void fakeusb_set_ops(const struct fakeusb_ops *ops);
/* Register a device: raw 18-byte device descriptor and the raw configuration descriptors (wire format,
 * concatenated, each wTotalLength long). Returns the device index or a negative libusb_error. */
int fakeusb_add_device(int bus, int address, int speed, const unsigned char *device_descriptor,
                       const unsigned char *configs, int configs_length);
/* Called by ops->wait for each completed transfer: status is a libusb_transfer_status, data the IN bytes. */
void fakeusb_complete(int dev, int transfer_id, int status, int actual_length, const unsigned char *data,
                      int data_length);
/* Number of libusb_transfer objects currently submitted and not yet completed (for leak checks in tests). */
int fakeusb_inflight_count(void);
/* Number of libusb_transfer objects allocated and not freed, and of open device handles / live contexts. */
int fakeusb_live_transfers(void);
int fakeusb_open_handles(void);
int fakeusb_live_contexts(void);
/* Calls of libusb_handle_events_* with the NULL context (the async helper must never make one). */
int fakeusb_null_context_event_calls(void);

#endif
