"""Perception: a uiautomator dump (plus OCR of the screenshot) becomes the planner's Scene."""
