"""What the host scrubs from later observations after typing a secret."""

from __future__ import annotations

from host.agent.redact import SecretRedactor
from host.timeline.record import SENSITIVE_MASK
from planner.scene import Bounds, Element, OcrObservation, Scene


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


def test_a_secret_the_screen_shows_grouped_is_masked_and_painted_over() -> None:
    """Android's Contacts shows a phone number typed as "5550100" as "555-0100", a card
    number field groups its digits: found only as typed, the value reached the next prompt,
    the decision log and the timeline, its screen area unpainted."""
    redactor = SecretRedactor()
    redactor.add("5550100")
    redactor.add("4111111111111111")
    redactor.add("2-3")  # too short to be looked for grouped: "2 3" stays
    assert redactor.text("Phone 555-0100") == f"Phone {SENSITIVE_MASK}"
    assert redactor.text("Mobile: 555 01 00.") == f"Mobile: {SENSITIVE_MASK}."
    assert redactor.text("(555) 0100") == f"({SENSITIVE_MASK}"
    assert redactor.text("555\u00a00100") == SENSITIVE_MASK
    assert redactor.text("Card 4111 1111 1111 1111 exp") == f"Card {SENSITIVE_MASK} exp"
    assert redactor.text("4111-1111-1111-1111") == SENSITIVE_MASK
    # Other numbers, and a short secret's lookalikes, are left alone.
    assert redactor.text("555-0199, 1.5 GB, 2 3") == "555-0199, 1.5 GB, 2 3"
    box = Bounds(0, 100, 500, 150)
    scene = Scene(
        elements=[
            Element("e1", box, text="555-0100", class_name="android.widget.TextView"),
            Element(
                "e2", Bounds(0, 0, 100, 50), text="Phone", class_name="android.widget.TextView"
            ),
        ],
        package="com.android.contacts",
        page_title="Contact",
        screen_width=1080,
        screen_height=2400,
    )
    masked, boxes = redactor.scene(scene)
    assert [e.text for e in masked.elements] == [SENSITIVE_MASK, "Phone"]
    assert boxes == [box]


def test_a_secret_the_screen_shows_in_other_letter_case_is_masked() -> None:
    """A view styled all caps shows "hunter2pw" as "HUNTER2PW", and OCR reads it so: found
    only in the case it was typed in, it went on to the next prompt as read."""
    redactor = SecretRedactor()
    redactor.add("hunter2pw")
    redactor.add("abc")  # too short to be looked for in other forms: "ABC" stays
    assert redactor.text("PASSWORD: HUNTER2PW") == f"PASSWORD: {SENSITIVE_MASK}"
    assert redactor.text("Hunter2pw") == SENSITIVE_MASK
    assert redactor.text("ABC news") == "ABC news"
    box = Bounds(10, 10, 200, 40)
    scene = Scene(
        elements=[],
        package="com.android.settings",
        page_title="Wi-Fi",
        screen_width=1080,
        screen_height=2400,
        ocr=[OcrObservation("HUNTER2PW", box, 0.9)],
    )
    masked, boxes = redactor.scene(scene)
    assert [o.text for o in masked.ocr] == [SENSITIVE_MASK]
    assert boxes == [box]
