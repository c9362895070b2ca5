"""The checker on real screens of the virtual phone (perceived as the host perceives them):
it says met or not met only when the screen shows it, with one line of evidence."""

from __future__ import annotations

from dataclasses import replace

from amc.v1 import types_pb2
from host.agent.actions import execute
from host.agent.redact import SecretRedactor
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.state import Contact
from host.devices.virtual.suite import CONTACTS, SETTINGS
from host.perception.perceive import Perceiver
from planner.observation import observation_from_scene
from planner.scene import Scene
from planner.steps import PastStep, StepOutcome, checked
from planner.verify import Check, disagree, state_claim, verify


def _scene(phone: VirtualPhone) -> Scene:
    return Perceiver(ocr=None, retry_delay_s=0.0).perceive(VirtualDriver(phone), False).scene


def _display(dark: bool = False) -> tuple[VirtualPhone, Scene]:
    phone = VirtualPhone("v")
    phone.state.settings["dark_theme"] = dark
    phone.launch(SETTINGS)
    phone.push("display")
    return phone, _scene(phone)


def test_a_switch_named_in_the_outcome_is_read_on_or_off() -> None:
    _, off = _display(dark=False)
    _, on = _display(dark=True)
    expected = "the 'Dark theme' switch is on"
    assert verify(expected, "tap", {"element_id": "e1"}, on) == Check(
        "met", "looked for the 'Dark theme' switch on: it is on"
    )
    assert verify(expected, "tap", {"element_id": "e1"}, off) == Check(
        "not_met", "looked for the 'Dark theme' switch on: it is off"
    )
    # the model's own wording, unquoted
    assert verify("Dark theme is enabled", "tap", {}, on).verdict == "met"


def test_a_page_named_in_the_outcome_is_open_or_the_screen_says_which_is() -> None:
    phone = VirtualPhone("v")
    phone.launch(SETTINGS)
    settings = _scene(phone)
    _, display = _display()
    check = verify("the 'Display' page is open", "tap", {"element_id": "e3"}, settings)
    assert check.verdict == "not_met"
    assert check.evidence == "looked for the 'Display' page: the screen shows 'Settings'"
    assert verify("the 'Display' page is open", "tap", {}, display).verdict == "met"
    assert verify("The Display settings page opens", "tap", {}, display).verdict == "met"


def test_a_removed_entry_is_gone_or_still_listed() -> None:
    phone = VirtualPhone("v")
    phone.state.contacts.extend([Contact("Alice Jones", "555 0001"), Contact("Bob Smith", "1")])
    phone.launch(CONTACTS)
    listed = _scene(phone)
    phone.state.contacts.pop()
    gone = _scene(phone)
    expected = "'Bob Smith' is no longer listed"
    assert verify(expected, "tap", {}, listed) == Check(
        "not_met", "looked for 'Bob Smith' to be gone: it is still shown"
    )
    assert verify(expected, "tap", {}, gone).verdict == "met"


def test_typed_text_is_compared_but_a_secret_never_is() -> None:
    phone = VirtualPhone("v")
    phone.launch(CONTACTS)
    phone.push("edit")
    empty = _scene(phone)
    check = verify("the 'Name' field shows 'Ada'", "input_text", {"text": "Ada"}, empty)
    assert check.verdict == "not_met" and "'Ada'" in check.evidence
    secret = verify("the PIN is entered", "input_text", {"text": "•••", "sensitive": True}, empty)
    assert secret.verdict == "unknown" and "•••" not in secret.evidence


def test_a_field_holding_a_typed_secret_is_filled_whatever_the_outcome_says_it_shows() -> None:
    """A secret typed as the prompt says ({{secret:NAME}}), with the outcome "the 'Name' field
    shows '{{secret:pin}}'" (or "... shows the PIN"), was judged not met: the checker compared
    the stated value with the field, which shows the host's mask. A sensitive step's outcome
    about a field is read as "the field is filled" only."""
    phone = VirtualPhone("v")
    phone.launch(CONTACTS)
    create = next(e for e in _scene(phone).elements if e.content_desc == "Create contact")
    add = types_pb2.Action(tap=types_pb2.TapAction(element_id=create.element_id))
    assert execute(VirtualDriver(phone), add, _scene(phone)).ok
    empty = _scene(phone)
    assert empty.page == "com.android.contacts: Create contact"
    field = next(e for e in empty.elements if e.hint == "Name")
    typed = types_pb2.Action(input_text=types_pb2.InputTextAction(text="4711", sensitive=True))
    typed.input_text.element_id = field.element_id
    assert execute(VirtualDriver(phone), typed, empty).ok
    redactor = SecretRedactor()  # what the host does to every screen after typing a secret
    redactor.add("4711")
    after, _ = redactor.scene(_scene(phone))
    masked = {"text": "•••", "sensitive": True, "element_id": field.element_id}
    for expected in ("the 'Name' field shows '{{secret:pin}}'", "the Name field shows the PIN"):
        check = verify(expected, "input_text", masked, after)
        assert check.verdict == "met", check
        assert verify(expected, "input_text", masked, empty).verdict == "unknown"


def test_a_secret_typed_by_reference_without_the_sensitive_flag_is_never_compared() -> None:
    """A model that types {{secret:pin}} as the prompt says but leaves `sensitive` unset: the
    host types the value in its place and masks it on every screen, yet the checker compared
    the reference itself with the field ("the fields show '•••'": not met)."""
    phone = VirtualPhone("v")
    phone.launch(CONTACTS)
    driver = VirtualDriver(phone)
    create = next(e for e in _scene(phone).elements if e.content_desc == "Create contact")
    add = types_pb2.Action(tap=types_pb2.TapAction(element_id=create.element_id))
    assert execute(driver, add, _scene(phone)).ok
    editor = _scene(phone)
    field = next(e for e in editor.elements if e.hint == "Name")
    typed = types_pb2.Action(input_text=types_pb2.InputTextAction(text="4711"))
    typed.input_text.element_id = field.element_id  # the value the host put in its place
    assert execute(driver, typed, editor).ok
    redactor = SecretRedactor()
    redactor.add("4711")
    after, _ = redactor.scene(_scene(phone))
    ref = {"text": "{{secret:pin}}", "sensitive": False, "element_id": field.element_id}
    for expected in ("the 'Name' field shows '{{secret:pin}}'", "the PIN is typed"):
        check = verify(expected, "input_text", ref, after)
        assert check.verdict != "not_met", check
    assert verify("the 'Name' field shows '{{secret:pin}}'", "input_text", ref, after).verdict == (
        "met"
    )


def test_the_previous_page_is_no_page_name() -> None:
    """Back from Display to Settings, expecting "the previous page is shown" (the offline
    planner's words for every back, and a model's too), was judged not met: the checker looked
    for a page titled 'previous'. Which page came before is on neither screen: a screen that
    did not change is not met, any other is unknown."""
    phone, display = _display()
    back = types_pb2.Action(press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_BACK))
    assert execute(VirtualDriver(phone), back, display).ok
    settings = _scene(phone)
    assert settings.page == "com.android.settings: Settings"
    key = {"key": "back"}
    for expected in ("the previous page is shown", "The previous screen appears"):
        check = verify(expected, "press_key", key, settings, display)
        assert check.verdict == "unknown", check
        assert "'Display' gave way to 'Settings'" in check.evidence
        assert verify(expected, "press_key", key, display, display).verdict == "not_met"
        assert verify(expected, "press_key", key, settings).verdict == "unknown"
    # a page that is named is still read
    assert verify("the Settings page is shown", "press_key", key, settings).verdict == "met"


def test_a_keyboard_still_shown_is_not_gone() -> None:
    """ "The keyboard is gone" (the offline planner's words after a back that hides it) was
    read as a text to look for: no label says "the keyboard", so it was met while the keyboard
    was still up. The keyboard (and a dialog) is read by its own rule, and "no longer shown"
    says gone too."""
    phone = VirtualPhone("v")
    phone.launch(CONTACTS)
    driver = VirtualDriver(phone)
    for name in ("Create contact", "Name"):  # open the editor, then focus its Name field
        scene = _scene(phone)
        element = next(e for e in scene.elements if name in (e.content_desc, e.hint))
        tap = types_pb2.Action(tap=types_pb2.TapAction(element_id=element.element_id))
        assert execute(driver, tap, scene).ok
    typing = _scene(phone)
    assert typing.keyboard_shown
    back = types_pb2.Action(press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_BACK))
    assert execute(driver, back, typing).ok
    hidden = _scene(phone)
    assert not hidden.keyboard_shown
    key = {"key": "back"}
    offline = "the keyboard is gone and the whole page is visible"  # the offline planner's
    for expected in ("the keyboard is gone", "The keyboard is no longer shown", offline):
        assert verify(expected, "press_key", key, typing, typing) == Check(
            "not_met", "looked for the keyboard to be gone: it is still shown"
        )
        assert verify(expected, "press_key", key, hidden, typing).verdict == "met"


def test_the_home_screen_is_read_where_the_step_goes_not_where_it_leaves_from() -> None:
    """Tapping Settings on the home screen, expecting "The Settings app is launched from the
    home screen", was not met ("looked for the home screen"): any mention of it was read as
    the destination. And pressing Home, expecting "the home screen is shown", was not met
    either: the page rule looked for a page titled 'home'."""
    phone = VirtualPhone("v")
    driver = VirtualDriver(phone)
    home = _scene(phone)
    icon = next(e for e in home.elements if e.text == "Settings")
    tap = types_pb2.Action(tap=types_pb2.TapAction(element_id=icon.element_id))
    assert execute(driver, tap, home).ok
    settings = _scene(phone)
    assert settings.page == "com.android.settings: Settings"
    args = {"element_id": icon.element_id}
    for leaving in (
        "The Settings app is launched from the home screen",
        "the Settings app leaves the launcher",
        "we are no longer on the home screen",
    ):
        assert verify(leaving, "tap", args, settings, home).verdict != "not_met", leaving
    press = types_pb2.Action(press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_HOME))
    assert execute(driver, press, settings).ok
    back_home = _scene(phone)
    key = {"key": "home"}
    for arriving in ("the home screen is shown", "The home screen appears", "the launcher"):
        assert verify(arriving, "press_key", key, back_home, settings).verdict == "met"
        assert verify(arriving, "press_key", key, settings, settings).verdict == "not_met"


def test_what_no_rule_reads_is_unknown_and_the_check_is_deterministic() -> None:
    _, display = _display()
    first = verify("something pleasant happens", "tap", {}, display)
    assert first.verdict == "unknown" and "no rule reads this outcome" in first.evidence
    assert verify("something pleasant happens", "tap", {}, display) == first
    assert verify("anything", "complete", {}, display).verdict == "unknown"
    launched = verify("Settings opens", "launch_app", {"package_name": SETTINGS}, display)
    assert launched.verdict == "met"
    other = verify("Clock opens", "launch_app", {"package_name": "com.x"}, display)
    assert other.verdict == "not_met"


def test_a_scroll_needs_the_screen_before_to_be_judged() -> None:
    _, display = _display()
    expected = "entries below the current ones are visible"
    assert verify(expected, "swipe", {}, display).verdict == "unknown"
    assert verify(expected, "swipe", {}, display, before=display).verdict == "not_met"


def test_disagreement_is_met_against_not_met_only() -> None:
    assert disagree("met", "not_met") and disagree("not_met", "met")
    assert not disagree("met", "unknown") and not disagree(None, "not_met")


def test_the_cloud_checks_an_outcome_a_host_sent_without_a_verdict() -> None:
    _, off = _display(dark=False)
    step = PastStep(
        step_index=3,
        page="com.android.settings: Display",
        tool_name="tap",
        arguments_json='{"element_id": "e9"}',
        target="Dark theme",
        purpose="turn 'Dark theme' on",
        expected_outcome="the 'Dark theme' switch is on",
        rationale=None,
    )
    bare = types_pb2.ActionOutcome(step_index=3, executed=True)
    filled, by_cloud = checked(bare, [step], off)
    assert by_cloud and filled is not None
    assert filled.verdict == types_pb2.VERDICT_NOT_MET
    assert "it is off" in filled.evidence
    host_said = types_pb2.ActionOutcome(step_index=3, executed=True, verdict=types_pb2.VERDICT_MET)
    assert checked(host_said, [step], off) == (host_said, False)
    # and the compact history shows the model the verdict
    event = replace(step, outcome=StepOutcome.from_proto(filled)).event(off.page)
    assert event.compact()["verdict"].startswith(
        "expected \"the 'Dark theme' switch is on\" — not met: looked for"
    )
    assert observation_from_scene(off).title == "Display"


def test_a_closing_claim_of_a_state_is_read_however_the_model_words_it() -> None:
    """`state_claim` reads the reason a run's `complete` gave, which a replay repeats: a model
    that found the switch on before doing anything says so with "already" ("Dark theme is
    already enabled."), and that was no claim the checker read (unknown), so a flow learned
    from such a run completed on a phone where the switch was off."""
    _, off = _display(dark=False)
    _, on = _display(dark=True)
    for reason in (
        "Dark theme is already enabled.",
        "The 'Dark theme' switch is already on",
        "Opened Display. Dark theme is now on.",
        "Dark theme is on; nothing else to do",
        # the past and perfect a model uses of a state it found set (were unknown)
        "Dark theme was already enabled.",
        "Dark theme has already been turned on.",
        "The Dark theme switch was already on, nothing to do.",
        "Dark theme has been enabled successfully",
    ):
        assert state_claim(reason, off).verdict == "not_met", reason
        assert state_claim(reason, on).verdict == "met", reason
    # not a state: a free-form reason, or a text that need not be on the final screen
    assert state_claim("Opened 'Display' and finished", off).verdict == "unknown"
    # what the state was before the run changed it is no claim of the state now
    assert state_claim("Dark theme was off, turned it on", on).verdict == "unknown"
    assert state_claim("", off).verdict == "unknown"


def test_an_option_selected_is_read_whatever_the_case_of_the_outcomes_words() -> None:
    """The selection rule alone was case-sensitive: "The '30 seconds' option Is selected" (a
    model's capitals) kept "The" in the option's name and read "Is" as no verb, so a step that
    chose the option was unknown where the screen showed it chosen (and not met where not)."""
    phone = VirtualPhone("v")
    phone.launch(SETTINGS)
    phone.push("screen_timeout", title="Screen timeout")
    screen = _scene(phone)
    for expected in ("The '30 seconds' option is selected", "'30 seconds' Is Selected"):
        assert verify(expected, "tap", {}, screen) == Check(
            "met", "looked for '30 seconds' selected: it is"
        ), expected
        assert verify(expected.replace("30 seconds", "5 minutes"), "tap", {}, screen).verdict == (
            "not_met"
        ), expected
