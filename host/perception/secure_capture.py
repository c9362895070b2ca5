"""Tell a screenshot the phone blacked out (a FLAG_SECURE window) from one that shows the app.

A banking app, a password screen or a DRM player marks its window secure: SurfaceFlinger then
puts black in every capture (`screencap`, uiautomator2's `takeScreenshot`) where the window
is, while accessibility still reports its views, so the dump is whole. Nothing else makes a
screen black exactly where the tree says texts and labels are drawn: a dark theme draws its
texts light, an image or video has no texts in the tree. The model, shown a black image or
OCR's nothing, acted blind; told, it plans from the elements.
"""

from __future__ import annotations

import io

from PIL import Image

from host.perception.fusion import same_aspect
from planner.scene import Scene

#: The brightest a pixel of a blacked-out window is (SurfaceFlinger writes 0; a JPEG
#: screenshot's compression adds a little noise).
BLACK_LUMA = 16
#: Boxes smaller than this (image pixels, either side) say too little to be counted.
_MIN_SIDE = 4
#: How far in from a box's edges it is looked at: a window above (the status bar, a toolbar's
#: shadow) may bleed a pixel or two over a neighbour's edge.
_INSET = 3


#: Without a tree, the share of the height at the top and at the bottom left out of the
#: check: the status and navigation bars are drawn over a secure window.
_BARS = 0.1


def blank_capture(png: bytes, image_size: tuple[int, int], scene: Scene) -> str:
    """Why `png` shows nothing of the app in front (for `Scene.screenshot_blank`), or "":
    every element of that app the tree names a text or a label for is black in it; with no
    tree at all (a DRM video player is secure and never idle), all of it between the bars.

    "" when the scene has a tree but no such element (an app without texts: nothing to tell
    a black image from a dark one by) or the image is turned against the screen."""
    screen = (scene.screen_width, scene.screen_height)
    if not scene.package or not same_aspect(image_size, screen):
        return ""
    if scene.tree_missing:
        return _black_between_bars(png, image_size, scene.package)
    fx, fy = image_size[0] / screen[0], image_size[1] / screen[1]
    boxes = []
    for e in scene.elements:
        if e.source != "tree" or e.package != scene.package or not (e.text or e.content_desc):
            continue
        box = (
            max(0, round(e.bounds.left * fx)) + _INSET,
            max(0, round(e.bounds.top * fy)) + _INSET,
            min(image_size[0], round(e.bounds.right * fx)) - _INSET,
            min(image_size[1], round(e.bounds.bottom * fy)) - _INSET,
        )
        if box[2] - box[0] >= _MIN_SIDE and box[3] - box[1] >= _MIN_SIDE:
            boxes.append(box)
    if not boxes:
        return ""
    with Image.open(io.BytesIO(png)) as image:
        for box in boxes:  # only the boxes are made gray: most screens end at the first
            # A one-band ("L") image's extrema are one (min, max) pair of numbers.
            _, brightest = image.crop(box).convert("L").getextrema()
            assert isinstance(brightest, (int, float))
            if brightest > BLACK_LUMA:
                return ""
    texts = "text or label" if len(boxes) == 1 else "texts and labels"
    return (
        f"black where the UI tree shows {len(boxes)} {texts} of {scene.package}: the app "
        "forbids screen capture (a secure window, as banking apps and password screens are)"
    )


def _black_between_bars(png: bytes, image_size: tuple[int, int], package: str) -> str:
    width, height = image_size
    bar = round(height * _BARS)
    with Image.open(io.BytesIO(png)) as image:
        middle = image.crop((0, bar, width, height - bar)).convert("L")
    _, brightest = middle.getextrema()
    assert isinstance(brightest, (int, float))  # one band: one (min, max) pair
    if brightest > BLACK_LUMA:
        return ""
    return (
        f"black, and {package} gave no UI tree either: the app most likely forbids screen "
        "capture (a secure window, as banking apps, password screens and video players "
        "are), so nothing of the screen can be seen"
    )
