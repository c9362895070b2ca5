"""Exports of a run: one neutral record (`run.py`), its sources' seams, and the files made from it
(HTML report, GIF/MP4 video, JSON Lines dataset) packed in one zip."""
