"""Wire formats of the adb server protocol (smart socket requests, shell v2 and sync packets).

Pure functions over bytes, so the server stays about connections and the framing is testable
on its own. Reference: AOSP `packages/modules/adb/{SERVICES,SYNC,protocol}.txt`.
"""

from __future__ import annotations

import struct

OKAY = b"OKAY"
FAIL = b"FAIL"
SERVER_VERSION = 41  # adbutils switches to host:tport at >= 41
FEATURES = "shell_v2,cmd,fixed_push_mkdir"

# shell v2 packet ids
STDIN, STDOUT, STDERR, EXIT, CLOSE_STDIN, WINDOW_SIZE = 0, 1, 2, 3, 4, 5
SYNC_DATA_MAX = 64 * 1024


def block(payload: str | bytes) -> bytes:
    """A length-prefixed string: 4 lowercase hex digits, then the bytes."""
    data = payload.encode() if isinstance(payload, str) else payload
    return f"{len(data):04x}".encode() + data


def okay_block(payload: str | bytes) -> bytes:
    return OKAY + block(payload)


def fail(message: str) -> bytes:
    return FAIL + block(message)


def shell_v2_packet(kind: int, data: bytes) -> bytes:
    return struct.pack("<BI", kind, len(data)) + data


def sync_packet(ident: bytes, *values: int) -> bytes:
    """A sync reply: 4-byte id followed by little-endian u32 fields."""
    return ident + struct.pack(f"<{len(values)}I", *values)


def sync_fail(message: str) -> bytes:
    data = message.encode()
    return b"FAIL" + struct.pack("<I", len(data)) + data


def sync_dent(name: str, mode: int, size: int, mtime: int) -> bytes:
    raw = name.encode()
    return b"DENT" + struct.pack("<IIII", mode, size, mtime, len(raw)) + raw


def sync_data_chunks(data: bytes) -> list[bytes]:
    return [
        b"DATA" + struct.pack("<I", len(part)) + part
        for part in (data[i : i + SYNC_DATA_MAX] for i in range(0, len(data), SYNC_DATA_MAX))
    ]


#: What the adb server answers a request for a phone in a state other than "device"
#: (adb's acquire_one_transport; $ADB_VENDOR_KEYS as on a server that has none).
REFUSALS = {
    "unauthorized": (
        "device unauthorized.\nThis adb server's $ADB_VENDOR_KEYS is not set\n"
        "Try 'adb kill-server' if that seems wrong.\n"
        "Otherwise check for a confirmation dialog on your device."
    ),
    "offline": "device offline",
    "authorizing": "device still authorizing",
    "connecting": "device still connecting",
    # adb's UsbNoPermissionsLongHelpText, on Linux when the phone's USB device is not the
    # adb server user's to open (no udev rule for it).
    "no permissions": (
        "insufficient permissions for device: user in plugdev group; are your udev rules "
        "wrong?\nSee [http://developer.android.com/tools/device.html] for more information"
    ),
}

#: How `adb devices` prints a state when it is more than its name (adb's
#: UsbNoPermissionsShortHelpText): a client that splits the line at spaces reads "no".
LISTED = {
    "no permissions": (
        "no permissions (user in plugdev group; are your udev rules wrong?); "
        "see [http://developer.android.com/tools/device.html]"
    ),
}


def devices_line(
    serial: str, state: str, *, long: bool, model: str, transport_id: int, usb: str = ""
) -> str:
    """One `adb devices[-l]` line; spaces in the model become underscores, as adb prints them.
    Only a phone in "device" has product, model and device tags: adb's append_transport
    prints what the phone's connection banner said, and a phone adb may not open, whose key
    it has not authorized, or that has not answered yet (every other state here) sent none.
    `usb` is the USB port adb names on Linux and macOS (`usb:1-1.2`), none when empty: in
    every state, as adb prints the transport's devpath."""
    listed = LISTED.get(state, state)
    if not long:
        return f"{serial}\t{listed}\n"
    port = f"usb:{usb} " if usb else ""
    if state != "device":
        return f"{serial:<22} {listed} {port}transport_id:{transport_id}\n"
    model_tag = model.replace(" ", "_")
    return (
        f"{serial:<22} {state} {port}product:amc_virtual model:{model_tag} device:amc_virtual "
        f"transport_id:{transport_id}\n"
    )


def framebuffer(width: int, height: int, rgba: bytes) -> bytes:
    """The `framebuffer:` service's reply after OKAY: a version 1 header (bpp, size, width,
    height, then offset and length of red, blue, green and alpha), then the RGBA pixels."""
    header = struct.pack("<13I", 1, 32, len(rgba), width, height, 0, 8, 16, 8, 8, 8, 24, 8)
    return header + rgba
