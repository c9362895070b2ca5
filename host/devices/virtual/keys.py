"""Android key codes by name (the subset `input keyevent` users send), and what they type."""

from __future__ import annotations

KEYCODES: dict[str, int] = {
    "HOME": 3,
    "BACK": 4,
    "CALL": 5,
    "ENDCALL": 6,
    "DPAD_UP": 19,
    "DPAD_DOWN": 20,
    "DPAD_LEFT": 21,
    "DPAD_RIGHT": 22,
    "DPAD_CENTER": 23,
    "VOLUME_UP": 24,
    "VOLUME_DOWN": 25,
    "POWER": 26,
    "CAMERA": 27,
    "COMMA": 55,
    "PERIOD": 56,
    "TAB": 61,
    "SPACE": 62,
    "ENTER": 66,
    "DEL": 67,
    "MINUS": 69,
    "AT": 77,
    "PLUS": 81,
    "MENU": 82,
    "SEARCH": 84,
    "ESCAPE": 111,
    "FORWARD_DEL": 112,
    "VOLUME_MUTE": 164,
    "APP_SWITCH": 187,
    "SLEEP": 223,
    "WAKEUP": 224,
}
KEYCODES.update({str(d): 7 + d for d in range(10)})
KEYCODES.update({chr(ord("A") + i): 29 + i for i in range(26)})
_TYPED = {55: ",", 56: ".", 62: " ", 69: "-", 77: "@", 81: "+"}


def typed_char(code: int) -> str:
    """The character a key types into a text field, or "" for keys that type nothing."""
    if 7 <= code <= 16:
        return str(code - 7)
    if 29 <= code <= 54:
        return chr(ord("a") + code - 29)
    return _TYPED.get(code, "")
