"""Device drivers behind one interface: adbutils, uiautomator2, and the virtual phone."""
