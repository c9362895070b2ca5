"""Folders of many small files, made fast: the retention fault tests need a host that spends
seconds deleting one (tests/faults/test_host_stopped_in_retention.py,
test_result_after_host_restart.py).

The files are hard links to a few real ones. On ext4 a link is made without a new inode, so
150,000 links take ~4.5 s to make on the loaded CI machine where the 60,000 written files these
tests used to make took 12-20 s, and the host's pass (`host.timeline.artifacts.remove_tree`: one
unlink per name) still spends at least as long deleting them (3.5-4.2 s against 2.5 s).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Files in the folder of an old task whose deletion takes seconds (~4 s on the CI machine).
MANY = 150_000
#: Links to one file: ext4 allows 65,000.
_LINKS_PER_FILE = 50_000


def fill_with_links(folder: Path, count: int = MANY) -> None:
    """`count` step screenshots (`step-<n>.png`) in the existing `folder`, each a hard link to
    one of a few real files that are themselves among them."""
    sources = []
    for n in range(-(-count // _LINKS_PER_FILE)):
        source = folder / f"step-{n}.png"
        source.write_bytes(b"png")
        sources.append(str(source))
    into = os.open(folder, os.O_RDONLY)
    try:
        for i in range(len(sources), count):
            os.link(sources[i // _LINKS_PER_FILE], f"step-{i}.png", dst_dir_fd=into)
    finally:
        os.close(into)
