"""What the host scrubs from later observations after typing a secret."""

from __future__ import annotations

from host.agent.redact import SecretRedactor
from host.timeline.record import SENSITIVE_MASK
from planner.scene import Bounds, Element, Scene


def test_the_secret_is_masked_wherever_it_shows() -> None:
    redactor = SecretRedactor()
    redactor.add("hunter2pw")
    assert redactor.text("hunter2pw") == SENSITIVE_MASK
    assert redactor.text("Name: hunter2pw!") == f"Name: {SENSITIVE_MASK}!"
    assert redactor.text("Settings") == "Settings"


def test_what_is_left_in_a_field_after_deleting_is_masked_but_not_lookalike_labels() -> None:
    redactor = SecretRedactor()
    redactor.add("hunter2pw")
    box = Bounds(0, 0, 100, 50)
    scene = Scene(
        elements=[
            Element("e1", box, text="hunter2", class_name="android.widget.EditText"),
            Element("e2", box, text="hun", class_name="android.widget.EditText"),  # too short
            Element("e3", box, text="hunter2", class_name="android.widget.TextView"),  # a label
        ],
        package="com.android.contacts",
        page_title="Create contact",
        screen_width=1080,
        screen_height=2400,
    )
    masked, boxes = redactor.scene(scene)
    assert [e.text for e in masked.elements] == [SENSITIVE_MASK, "hun", "hunter2"]
    assert boxes == [box]  # the field's area is painted over too
