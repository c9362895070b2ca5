"""Fuzzed hierarchy dumps and screenshots into perception: a clear error or a scene, never a crash.

The parser gets random text, XML-ish documents built from uiautomator's own vocabulary with hostile
attribute values (malformed and huge bounds, odd flags), deep nesting, an entity-expansion bomb
and truncated dumps. The whole `Perceiver` (with the reused OCR engine) gets those dumps and
screenshots that are random bytes, truncated PNGs, a PNG header announcing gigapixels, tiny and
odd-mode images. Proves: the only exceptions are `DeviceError`s (the type the agent loop turns
into a failed step with its reason) with a message, and everything else yields a Scene.

`FuzzDriver` is a stand-in for a phone: the fuzz must choose exactly what the "phone" returns,
which neither a real phone nor the virtual one lets a test do.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from host.devices.base import DeviceError
from host.perception.hierarchy import parse_scene
from host.perception.ocr import OcrPool
from host.perception.perceive import Perceiver

pytestmark = pytest.mark.filterwarnings(
    # Hypothesis warns (an error here) when it prints a failing large example.
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)

FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

_ATTRS = [
    "index",
    "text",
    "resource-id",
    "class",
    "package",
    "content-desc",
    "checkable",
    "checked",
    "clickable",
    "enabled",
    "focusable",
    "focused",
    "scrollable",
    "long-clickable",
    "password",
    "selected",
    "bounds",
    "rotation",
]
_BOUNDS = st.one_of(
    st.builds(
        lambda a, b, c, d: f"[{a},{b}][{c},{d}]",
        *[st.integers(-(2**40), 2**40)] * 4,
    ),
    st.sampled_from(["", "[0,0]", "[a,b][c,d]", "[0,0][0,0]", "[1,1][0,0]", "0,0,10,10"]),
    st.text(max_size=20),
)
_VALUE = st.one_of(
    st.sampled_from(["true", "false", "TRUE", "", "android.widget.EditText", "x" * 10_000]),
    st.text(alphabet=st.characters(exclude_categories=("Cs", "Cc")), max_size=30),
)


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


@st.composite
def _node(draw: st.DrawFn, depth: int = 0) -> str:
    attrs = draw(st.dictionaries(st.sampled_from(_ATTRS), _VALUE, max_size=8))
    if draw(st.booleans()):
        attrs["bounds"] = draw(_BOUNDS)
    rendered = " ".join(f'{k}="{_escape(v)}"' for k, v in attrs.items())
    children = draw(st.lists(_node(depth + 1), max_size=3)) if depth < 3 else []
    tag = draw(st.sampled_from(["node", "node", "node", "view", "hierarchy"]))
    return f"<{tag} {rendered}>{''.join(children)}</{tag}>"


def _deep(levels: int) -> str:
    node = '<node bounds="[0,0][10,10]" text="x" clickable="true">'
    return f'<hierarchy rotation="0">{node * levels}{"</node>" * levels}</hierarchy>'


BOMB = (
    '<?xml version="1.0"?><!DOCTYPE h [<!ENTITY a "aaaaaaaaaa">'
    + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(8))
    + ']><hierarchy><node text="&i;" bounds="[0,0][1,1]"/></hierarchy>'
)
XXE = (
    '<?xml version="1.0"?><!DOCTYPE h [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
    '<hierarchy><node text="&x;" bounds="[0,0][1,1]"/></hierarchy>'
)

DUMPS = st.one_of(
    st.text(max_size=200),
    st.builds(lambda n: f'<?xml version="1.0"?><hierarchy rotation="0">{n}</hierarchy>', _node()),
    _node(),
    st.builds(lambda n, cut: n[:cut], _node(), st.integers(0, 200)),
    st.sampled_from([_deep(50), _deep(3000), _deep(100_000), BOMB, XXE, "<hierarchy/>", "\x00"]),
)
SIZES = st.one_of(st.none(), st.tuples(st.integers(-5, 5000), st.integers(-5, 5000)))


def _png(width: int, height: int, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height)).save(buf, format="PNG")
    return buf.getvalue()


def _giant_header() -> bytes:
    """A valid PNG signature and IHDR announcing 100000 x 100000 pixels (a decompression bomb)."""
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + struct.pack(">I", 0)
        + b"IEND"
        + struct.pack(">I", zlib.crc32(b"IEND"))
    )


SCREENSHOTS = st.one_of(
    st.binary(max_size=300),
    st.just(b""),
    st.builds(lambda cut: _png(64, 64)[:cut], st.integers(0, 80)),
    st.just(_giant_header()),
    st.builds(
        _png,
        st.integers(1, 64),
        st.integers(1, 64),
        st.sampled_from(["RGB", "L", "1", "P", "RGBA"]),
    ),
)


def _clear(exc: BaseException) -> None:
    assert isinstance(exc, DeviceError), f"{type(exc).__name__}: {exc}"
    assert len(str(exc)) >= 5, repr(exc)


@FUZZ
@given(dump=DUMPS, size=SIZES, package=st.one_of(st.none(), st.text(max_size=10)))
def test_fuzzed_dumps_give_a_scene_or_a_clear_error(
    dump: str, size: tuple[int, int] | None, package: str | None
) -> None:
    try:
        scene = parse_scene(dump, size, package)
    except Exception as exc:
        _clear(exc)
        return
    assert all(e.element_id for e in scene.elements)
    assert "root:" not in str(scene)  # no /etc/passwd pulled in through an external entity


class FuzzDriver:
    """Returns exactly the screenshot and dump the test chose (see the module docstring)."""

    def __init__(self, png: bytes, dump: str, size: tuple[int, int]) -> None:
        self.serial = "fuzz-1"
        self._png, self._dump, self._size = png, dump, size

    def screenshot_png(self) -> bytes:
        return self._png

    def dump_hierarchy(self) -> str:
        return self._dump

    def screen_size(self) -> tuple[int, int]:
        return self._size

    def current_app(self) -> str:
        return "com.example"


@pytest.fixture(scope="module")
def ocr() -> Iterator[OcrPool]:
    pool = OcrPool()
    try:
        yield pool
    finally:
        pool.close()


@settings(FUZZ, max_examples=50)  # each example runs OCR: fewer, still every strategy branch
@given(
    png=SCREENSHOTS,
    dump=DUMPS,
    size=st.tuples(st.integers(1, 3000), st.integers(1, 3000)),
)
def test_fuzzed_screens_into_the_perceiver(
    ocr: OcrPool, png: bytes, dump: str, size: tuple[int, int]
) -> None:
    perceiver = Perceiver(ocr, retries=2, retry_delay_s=0)
    try:
        # FuzzDriver has what perceive() reads; the Driver protocol also asks for input methods.
        observation = perceiver.perceive(FuzzDriver(png, dump, size), with_ocr=True)  # type: ignore[arg-type]
    except Exception as exc:
        _clear(exc)
        return
    assert observation.scene is not None
