"""The built-in virtual Android phone: apps, screens, an adb server and an in-process driver."""
