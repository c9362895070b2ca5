"""Learned flows in the planner: goal parameters, synthesis, the lexical scorer, and replay
inside `plan_step` on the virtual phone (learned from a real offline run, replayed on a fresh
phone with no model call, handed over where the screen differs)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from amc.v1 import types_pb2
from host.agent.actions import changes_screen, execute
from host.agent.verdicts import ReplayTally, check_step
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.state import Note
from host.devices.virtual.suite import CONTACTS, NOTES, SETTINGS, snapshot
from host.perception.perceive import Perceiver
from host.planner_client import DirectPlanner
from planner import labels
from planner.decision import MAX_MODEL_TEXT, Decision, Usage, kept
from planner.flows import language, params
from planner.flows.replay import replay
from planner.flows.scoring import Candidate, LexicalScorer, bound
from planner.flows.synthesis import SourceStep, fingerprint, needed_parameters, synthesize
from planner.history import WorldEvent
from planner.planner import Planner
from planner.providers.offline import OfflineProvider
from planner.scene import Scene
from planner.steps import PastStep, StepOutcome
from planner.targets import describe
from tests.planner.scenes import H, W, el
from tests.support import flows as made
from tests.support.flows import contact_steps, dark_theme_flow, dark_theme_steps

GOAL = "Turn on dark theme"
#: The contact steps type a PIN as sensitive text: the goal names it, never spells it.
CONTACT_GOAL = "Create a contact named Ada Lovelace with phone 555 0100 and PIN {{secret:pin}}"


class CountingOffline(OfflineProvider):
    """The offline provider, counting the model calls it answers."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request):  # type: ignore[no-untyped-def]
        self.calls += 1
        return await super().complete(request)


@dataclass
class Run:
    decisions: list[Decision] = field(default_factory=list)
    sources: list[SourceStep] = field(default_factory=list)
    #: The screen each decision was made on.
    scenes: list[Scene] = field(default_factory=list)


async def _run(
    phone: VirtualPhone, flows: list[types_pb2.Flow], provider: OfflineProvider, goal: str = GOAL
) -> Run:
    """The host's loop in miniature (perceive, plan through the typed contract, execute, check
    the outcome on the screen after), keeping what the decision log would keep."""
    driver, perceiver = VirtualDriver(phone), Perceiver(ocr=None, retry_delay_s=0.0)
    planner = DirectPlanner(Planner(provider), flows)
    history: list[WorldEvent] = []
    run = Run()
    for index in range(1, 31):
        scene = perceiver.perceive(driver, False).scene
        decision = await planner.decide(goal, scene, history)
        result = execute(driver, decision.action, scene)
        event = WorldEvent.from_decision(decision, page=scene.page, success=result.ok)
        verdict = None
        if result.ok and changes_screen(decision.action):
            check = check_step(decision, True, scene, perceiver.perceive(driver, False).scene)
            if check is not None:
                event.verdict, event.evidence, verdict = (
                    check.verdict,
                    check.evidence,
                    check.verdict,
                )
        history.append(event)
        run.decisions.append(decision)
        run.scenes.append(scene)
        run.sources.append(
            SourceStep(
                index,
                decision.tool_name,
                decision.masked_arguments(),
                decision.action,
                decision.target_descriptor,
                decision.purpose,
                decision.expected_outcome,
                scene.page,
                verdict,
                result.ok,
            )
        )
        if decision.tool_name == "complete":
            break
    return run


def test_goal_parameters_are_slots_a_new_goal_fills() -> None:
    template, slots = params.template_goal(
        "Create a contact named Ada Lovelace with phone 555 0100", ["Ada Lovelace", "555 0100"]
    )
    assert template == "Create a contact named {p1} with phone {p2}"
    assert slots == {"Ada Lovelace": "p1", "555 0100": "p2"}
    assert params.bind(template, "create a contact named  Alan Turing with phone 555 0111") == {
        "p1": "Alan Turing",
        "p2": "555 0111",
    }
    assert params.bind(template, "Turn on dark theme") is None
    alarm, _ = params.template_goal("Set an alarm for 10:15 PM", ["15", "10", "PM"])
    assert alarm == "Set an alarm for {p1}:{p2} {p3}"
    assert params.missing(["p1", "secret1"], {"p1": "x"}) == ["secret1"]


def test_a_typed_value_the_goal_says_twice_stays_literal() -> None:
    """Typing "on" in "Set the alarm on and turn on vibration" made both "on"s one slot: the
    learned template bound "… alarm off and turn on vibration" to nothing (a slot used twice
    must agree) and bound the goal it came from only by making both places the typed value.
    A value is a slot only where the goal says it once; said twice, it stays literal."""
    goal = "Set the alarm on and turn on vibration"
    assert params.template_goal(goal, ["on"]) == (goal, {})
    template, slots = params.template_goal(goal + " with label Wake", ["on", "Wake"])
    assert template == goal + " with label {p1}"
    assert slots == {"Wake": "p1"}
    assert params.bind(template, goal + " with label Gym") == {"p1": "Gym"}
    assert params.bind(template, "Set the alarm off and turn on vibration with label Gym") is None
    # said once, the short value is still a slot a similar goal fills
    short, _ = params.template_goal("Set the volume to 5", ["5"])
    assert params.bind(short, "Set the volume to 7") == {"p1": "7"}


def test_a_value_stops_where_the_goal_resumes_or_ends_politely() -> None:
    """A flow learned from "Call 555 0100" took "Call 555 0111, please" as p1 = "555 0111,
    please", and its replay dialled that: the last slot took the rest of the goal. A value
    now stops where the template's text resumes and at the goal's closing punctuation or
    "please"; a value of punctuation only binds nothing."""
    call, slots = params.template_goal("Call 555 0100", ["555 0100"])
    assert (call, slots) == ("Call {p1}", {"555 0100": "p1"})
    for goal in ["Call 555 0111, please", "call 555 0111.", "Call 555 0111 please!",
                 "Call 555 0111, thank you", "Call  555 0111"]:  # fmt: skip
        assert params.bind(call, goal) == {"p1": "555 0111"}, goal
    # punctuation inside a value, and words that only start like "please", stay in it
    assert params.bind(call, "Call Dr. Who, please") == {"p1": "Dr. Who"}
    assert params.bind(call, "Call Thanksgiving Hotline") == {"p1": "Thanksgiving Hotline"}
    for goal in ["Call ?!", "Call .", "Call", "Text 555 0111, please"]:
        assert params.bind(call, goal) is None, goal
    # a value may be a polite word itself, where the goal goes on after it
    send, _ = params.template_goal("Send Hello to Ada", ["Hello", "Ada"])
    assert params.bind(send, "Send thanks to Alan, please") == {"p1": "thanks", "p2": "Alan"}

    contact, _ = params.template_goal(
        "Create a contact named Ada Lovelace with phone 555 0100", ["Ada Lovelace", "555 0100"]
    )
    assert params.bind(
        contact, "Create a contact named Alan Turing, with phone 555 0111, thanks."
    ) == {"p1": "Alan Turing", "p2": "555 0111"}
    assert params.bind(contact, "Create a contact named Alan Turing, please") is None

    # learned from a polite goal: the plain one binds too, and the politeness is no slot
    polite, _ = params.template_goal("Call 555 0100, please", ["555 0100"])
    assert polite == "Call {p1}, please"
    assert params.bind(polite, "Call 555 0111") == {"p1": "555 0111"}
    # the once-only and dotted-name rules still hold
    twice = "Call 555 0100, please, call 555 0100"
    assert params.template_goal(twice, ["555 0100"]) == (twice, {})
    dotted = "Open com.android.contacts, please"
    assert params.template_goal(dotted, ["Android"]) == (dotted, {})
    opener, _ = params.template_goal("Open Contacts, please", ["Contacts"])
    assert params.bind(opener, "Open com.android.dialer.") == {"p1": "com.android.dialer"}


def test_a_typed_value_keeps_its_own_exclamation_or_question_mark() -> None:
    """A value's closing "!" or "?" is what a run types ("Type Good morning!"), not the goal's
    punctuation: the closing rule took it off, so a replay typed "Good morning". It stays the
    value's, unless the template closed with it after its slot (the learned value had none)."""
    typing, _ = params.template_goal("Type Hello world!", ["Hello world!"])
    assert typing == "Type {p1}"
    assert params.bind(typing, "Type Good morning!") == {"p1": "Good morning!"}
    assert params.bind(typing, "Type Are you there?") == {"p1": "Are you there?"}
    assert params.bind(typing, "Type Good morning, please.") == {"p1": "Good morning"}
    send, _ = params.template_goal("Send Hi! to Bob", ["Hi!"])
    assert params.bind(send, "Send Yo! to Bob") == {"p1": "Yo!"}
    shouted, _ = params.template_goal("Call 555 0100!", ["555 0100"])
    assert shouted == "Call {p1}!"
    for goal in ["Call 555 0111!", "Call 555 0111", "Call 555 0111?"]:
        assert params.bind(shouted, goal) == {"p1": "555 0111"}, goal


def test_synthesis_keeps_semantics_parameters_and_never_a_secret() -> None:
    made = synthesize(CONTACT_GOAL, contact_steps())
    flow = made.flow
    assert flow is not None
    assert (
        flow.goal_template == "Create a contact named {p1} with phone {p2} and PIN {{secret:pin}}"
    )
    assert [s.text_parameter for s in flow.steps] == ["", "p1", "p2", "secret1"]
    assert needed_parameters(flow) == ["p1", "p2", "secret1"]
    assert all(s.action.input_text.text == "" for s in flow.steps[1:])
    assert flow.steps[1].expected_outcome == "the 'Name' field shows '{p1}'"
    assert flow.steps[-1].page_after == "com.android.contacts: {p1}"
    assert not any(s.action.tap.element_id for s in flow.steps)
    wire = flow.SerializeToString()
    assert b"hunter2" not in wire and b"Ada" not in wire and b"0100" not in wire
    assert "fill in 'Name'" in flow.embedding_text and "{p1}" in flow.embedding_text
    assert (
        synthesize(CONTACT_GOAL, contact_steps()).fingerprint
        == made.fingerprint
        == fingerprint(flow)
    )


def test_a_secret_the_goal_spells_out_is_never_learned() -> None:
    """The log masks a sensitive text, so a goal holding the value itself ("... PIN hunter2")
    would carry it into the goal template and the embedding text (sent to an embeddings API):
    such a run is not learned. The same run whose goal names the secret is."""
    made = synthesize("Create a contact named Ada Lovelace with phone 555 0100 and PIN hunter2",
                      contact_steps())  # fmt: skip
    assert made.flow is None and "sensitive" in made.why
    assert synthesize(CONTACT_GOAL, contact_steps()).flow is not None


def test_a_text_the_decision_log_kept_cut_is_never_learned() -> None:
    """The log keeps an action text over 64 KiB cut, with a marker (`kept`): a flow learned
    from it would type the cut text and the marker on every replay."""
    steps = contact_steps()
    typed = next(i for i, s in enumerate(steps) if s.tool_name == "input_text")
    long_text = "Ada Lovelace " * 6000
    cut = dataclasses.replace(
        steps[typed],
        arguments={**steps[typed].arguments, "text": kept(long_text, MAX_MODEL_TEXT, "this")},
    )
    made = synthesize(CONTACT_GOAL, [*steps[:typed], cut, *steps[typed + 1 :]])
    assert made.flow is None
    assert made.why == f"step {cut.step_index}'s action was cut to the decision log's limit"


def test_synthesis_needs_a_successful_end_and_skips_what_did_not_run() -> None:
    steps = dark_theme_steps()
    assert synthesize(GOAL, steps[:-1]).flow is None
    page = "com.android.settings: Settings"  # a tap that failed left the screen as it was
    failed = SourceStep(9, "tap", {"element_id": "e9"}, steps[0].action, None, "x", "y", page,
                        executed=False)  # fmt: skip
    made = synthesize(GOAL, [steps[0], failed, *steps[1:]])
    assert made.flow is not None and len(made.flow.steps) == 3
    assert made.flow.steps[0].page_after == "com.android.settings: Settings"


async def test_a_step_without_its_page_is_never_learned_nor_replayed() -> None:
    """A replay checks the page of every step before it acts: a step recorded with no page (a
    decision shipped with no screen) would be replayed blind on whatever screen is open."""
    steps = dark_theme_steps()
    pageless = [steps[0], dataclasses.replace(steps[1], page=""), *steps[2:]]
    made = synthesize(GOAL, pageless)
    assert made.flow is None and made.why.startswith(f"step {steps[1].step_index} has no page")
    no_end_page = [*steps[:-1], dataclasses.replace(steps[-1], page="")]
    assert synthesize(GOAL, no_end_page).flow is None

    # a flow stored without its pages (before the cloud kept them): the model plans instead
    flow = dark_theme_flow()
    flow.flow_id = "f1"
    for step in flow.steps:
        step.page_before = ""
    provider = CountingOffline()
    run = await _run(VirtualPhone("v"), [flow], provider)
    assert provider.calls >= 1
    assert {d.planner_mode for d in run.decisions} == {"compact"}
    assert not any(d.flow_id for d in run.decisions)


def test_the_lexical_scorer_matches_the_goal_not_its_verb_nor_its_opposite() -> None:
    dark = dark_theme_flow()
    contact = synthesize(CONTACT_GOAL, contact_steps())
    assert contact.flow is not None
    scorer = LexicalScorer(
        [
            Candidate("dark", dark.goal_template, dark.embedding_text),
            Candidate("off", "Turn off dark theme", ""),
            Candidate(
                "contact",
                contact.flow.goal_template,
                contact.flow.embedding_text,
                tuple(needed_parameters(contact.flow)),
            ),
        ]
    )
    ranked = {s.flow_id: s for s in scorer.score(GOAL)}
    assert ranked["dark"].score == 1.0 and ranked["dark"].usable
    assert not ranked["off"].usable and "opposite" in ranked["off"].why
    wifi = {s.flow_id: s for s in scorer.score("Turn on Wi-Fi")}
    assert wifi["dark"].score < 0.3
    person = {
        s.flow_id: s
        for s in scorer.score("Create a contact named Alan with phone 1 and PIN {{secret:pin}}")
    }
    assert person["contact"].score == 1.0
    assert "secret1" in person["contact"].why  # a secret no goal supplies: never replayed


def test_a_polite_goal_scores_as_the_plain_one() -> None:
    """ "Turn on dark theme, thanks!" scored 0.63 against the flow for "Turn on dark theme" (the
    threshold is 0.8): "thanks" counted as something the flow did not do. And once a value
    stopped before a closing "thanks", "Call 555 0111, thank you." scored 0.40 against "Call
    {p1}". What a goal closes with asks for nothing: it is left out of the score."""
    scorer = LexicalScorer(
        [
            Candidate("dark", GOAL, dark_theme_flow().embedding_text),
            Candidate("call", "Call {p1}", "dial {p1}", ("p1",)),
        ]
    )
    for goal in ["Turn on dark theme, thanks!", "turn on dark theme, thank you.", GOAL + "."]:
        assert scorer.score(goal)[0] == scorer.score(GOAL)[0], goal
    for goal in ["Call 555 0111, thanks", "Call 555 0111, thank you.", "Call 555 0111!"]:
        assert scorer.score(goal)[0].score == 1.0, goal
        assert scorer.score(goal)[0].values == {"p1": "555 0111"}, goal
    # words that only start like "thanks" still count
    assert scorer.score("Turn on dark theme for Thanksgiving")[0].score < 0.8


def test_a_goal_that_turns_one_of_the_flows_directions_is_its_opposite() -> None:
    """A flow for "Turn on dark theme and turn off battery saver" scored 1.0 and was usable for
    "Turn off dark theme and turn on battery saver": direction words weigh nothing in the score
    and the opposite rule only caught a goal going one way. Replayed, it turned dark theme on.
    Directions are compared in order when goal and flow say as many."""
    both = "Turn on dark theme and turn off battery saver"
    flow = Candidate("both", both, both)
    scorer = LexicalScorer([flow, Candidate("dark", GOAL, GOAL)])
    same = {s.flow_id: s for s in scorer.score(both)}["both"]
    assert same.score == 1.0 and same.usable
    for turned in (
        "Turn off dark theme and turn on battery saver",
        "Turn on dark theme and turn on battery saver",
    ):
        scored = {s.flow_id: s for s in scorer.score(turned)}["both"]
        assert not scored.usable and "opposite" in scored.why, scored
    # a parameter's words are no direction: "Stop" is the name typed, not the goal's way
    contact = Candidate("contact", "Create a contact named {p1}", "", ("p1",))
    assert bound(contact, "Create a contact named Stop Watch") == ({"p1": "Stop Watch"}, "")
    assert not bound(Candidate("on", GOAL, ""), "Turn off dark theme")[0]
    assert "opposite" in bound(Candidate("on", GOAL, ""), "Turn off dark theme")[1]


async def test_a_flow_learned_on_the_virtual_phone_replays_with_no_model_call() -> None:
    learn_provider = CountingOffline()
    learned = await _run(VirtualPhone("v"), [], learn_provider)
    assert learned.decisions[-1].tool_name == "complete" and learn_provider.calls >= 3
    made = synthesize(GOAL, learned.sources)
    assert made.flow is not None, made.why
    flow = made.flow
    flow.flow_id = "f1"

    # the launcher's title is today's date: another day is still the home screen
    flow.steps[0].page_before = flow.steps[0].page_before.split(": ")[0] + ": Monday, Jan 1"
    phone = VirtualPhone("v")
    before = snapshot(phone)
    provider = CountingOffline()
    replayed = await _run(phone, [flow], provider)
    assert provider.calls == 0
    assert {d.planner_mode for d in replayed.decisions} == {"replay"}
    assert all(d.usage == Usage() for d in replayed.decisions)
    assert [d.flow_step for d in replayed.decisions] == list(range(1, len(flow.steps) + 2))
    assert replayed.decisions[-1].arguments["success"] is True
    assert phone.state.flag("dark_theme")
    changed = {k for k, v in snapshot(phone).items() if before.get(k) != v}
    assert changed == {"settings.dark_theme"}


async def test_a_typed_value_that_names_part_of_a_package_still_replays() -> None:
    """A contact named "Android", learned on the virtual phone, made every page's package
    "com.{p1}.contacts" (a whole-word match inside the dotted name): the next goal's name went
    into the package, so the flow never fit the screen, not even for the goal it came from."""
    goal = "Create a contact named Android"
    learned = await _run(VirtualPhone("v"), [], CountingOffline(), goal)
    flow = synthesize(goal, learned.sources).flow
    assert flow is not None and flow.goal_template == "Create a contact named {p1}"
    assert all(s.page_before.startswith("com.android.") for s in flow.steps)
    flow.flow_id = "f1"
    flow.parameters["p1"] = "Bob"
    provider = CountingOffline()
    replayed = await _run(VirtualPhone("v"), [flow], provider, "Create a contact named Bob")
    assert provider.calls == 0
    assert {d.planner_mode for d in replayed.decisions} == {"replay"}
    assert replayed.decisions[-1].arguments["success"] is True
    assert [d.arguments["text"] for d in replayed.decisions if d.tool_name == "input_text"] == [
        "Bob"
    ]


async def test_a_replay_completes_with_its_own_goal_values_not_the_learned_ones() -> None:
    """The replay's `complete` (the task's result summary) repeated the learned run's reason
    word for word: a flow learned from Ada Lovelace, replayed for Alan Turing, reported
    "saved: 'Ada Lovelace', '555 0100' shown on 'Ada Lovelace'", a false record that also
    carried one task's values into another's result."""
    goal = "Create a contact named Ada Lovelace with phone 555 0100"
    learned = await _run(VirtualPhone("v"), [], CountingOffline(), goal)
    flow = synthesize(goal, learned.sources).flow
    assert flow is not None and "Ada" not in flow.completion and "0100" not in flow.completion
    flow.flow_id = "f1"
    other = "Create a contact named Alan Turing with phone 555 0111"
    values = params.bind(flow.goal_template, other)
    assert values == {"p1": "Alan Turing", "p2": "555 0111"}
    flow.parameters.update(values)
    provider = CountingOffline()
    replayed = await _run(VirtualPhone("v"), [flow], provider, other)
    assert provider.calls == 0
    reason = replayed.decisions[-1].arguments["reason"]
    assert "Alan Turing" in reason and "555 0111" in reason and "Ada" not in reason, reason


async def test_a_replay_hands_over_where_the_screen_differs_and_the_goal_is_still_reached() -> None:
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None
    flow.flow_id = "f1"

    # the 'Display' row renamed by another app version: the second step does not fit
    renamed = types_pb2.Flow()
    renamed.CopyFrom(flow)
    next(s for s in renamed.steps if s.target.row_label == "Display").target.row_label = "Screen"
    provider = CountingOffline()
    run = await _run(VirtualPhone("v"), [renamed], provider)
    handover = run.decisions[1]
    assert handover.planner_mode == "compact" and provider.calls > 0
    assert (handover.flow_id, handover.flow_step) == ("f1", 2)
    assert "its target is not here" in handover.replay_divergence
    assert "flow f1" in handover.user_prompt and "Step 2 diverged" in handover.user_prompt
    assert run.decisions[-1].arguments["success"] is True

    # dark theme already on: the flow would undo it at its switch step; it hands over there,
    # as no divergence (the phone's state, not a changed app: counted, three phones already
    # on retired a sound flow)
    already = VirtualPhone("v")
    already.state.settings["dark_theme"] = True
    run = await _run(already, [flow], CountingOffline())
    toggle = next(d for d in run.decisions if d.planner_mode != "replay")
    # no divergence, but the step's record says the flow was set aside there, and why
    assert (toggle.flow_id, toggle.flow_step, toggle.replay_divergence) == ("f1", 3, "")
    assert "'Dark theme' LinearLayout is already on" in toggle.flow_set_aside
    assert "'Dark theme' LinearLayout is already on" in toggle.user_prompt
    assert f"Step {len(flow.steps)} was not replayed" in toggle.user_prompt
    assert [d.planner_mode for d in run.decisions[: len(flow.steps) - 1]] == ["replay"] * (
        len(flow.steps) - 1
    )
    assert already.state.flag("dark_theme"), "the replay must not flip it off"
    tally = ReplayTally()
    for decision in run.decisions:
        tally.saw(decision)
    report = tally.report()
    assert report is not None and report.flow_id == "f1" and not report.diverged
    # the model finished it: no replay that ran to its end (the cloud counted it as one)
    assert report.HasField("completed") and not report.completed


async def test_a_phone_left_where_the_flows_switch_step_acts_and_already_set_is_no_divergence() -> (
    None
):
    """A phone left on 'Display' hands over as no divergence (`midway`: the screen is where
    the flow's step 3 acts), but one left there with dark theme already on counted a
    divergence at step 1 (its step 3 did not "fit": the switch is already on), and three such
    phones retired a sound flow. The phone is part-way through the flow either way."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None and len(flow.steps) == 3
    flow.flow_id = "f1"
    phone = VirtualPhone("v")
    phone.state.settings["dark_theme"] = True
    phone.launch(SETTINGS)
    phone.push("display")
    run = await _run(phone, [flow], CountingOffline())
    first = run.decisions[0]
    assert (first.flow_id, first.flow_step, first.replay_divergence) == ("f1", 3, "")
    assert "its step 3 acts" in first.flow_set_aside and "already on" in first.flow_set_aside
    assert "part-way through it already" in first.user_prompt
    assert "its step 3 acts" in first.user_prompt and "already on" in first.user_prompt
    assert run.decisions[-1].arguments["success"] is True and phone.state.flag("dark_theme")


async def test_a_flow_learned_where_the_goal_was_already_reached_claims_nothing_on_replay() -> None:
    """A run on a phone with dark theme already on opened Display, saw the switch on and
    completed: it was learned as a flow with no step that turns it on, and its replay on a
    phone with dark theme off completed "'Dark theme' is on" with no model call, the switch
    off. The replay checks its closing claim on the screen: not so, the model takes over
    there (the divergence counted on the flow), and a flow that shares its steps and goes on
    from there (the one learned where the switch was off) takes over first."""
    already = VirtualPhone("v")
    already.state.settings["dark_theme"] = True
    lazy = synthesize(GOAL, (await _run(already, [], CountingOffline())).sources).flow
    assert lazy is not None and len(lazy.steps) == 2  # Settings, Display: nothing to turn on
    lazy.flow_id = "lazy"

    provider = CountingOffline()
    off = VirtualPhone("v")
    run = await _run(off, [lazy], provider)
    assert off.state.flag("dark_theme"), "the replay claimed success with dark theme off"
    handover = next(d for d in run.decisions if d.planner_mode != "replay")
    assert (handover.flow_id, handover.flow_step) == ("lazy", 3) and provider.calls > 0
    assert "'Dark theme' switch on: it is off" in handover.replay_divergence
    assert "Step 3 (its closing complete) diverged" in handover.user_prompt
    assert [d.planner_mode for d in run.decisions[:2]] == ["replay", "replay"]

    sound = synthesize(GOAL, (await _run(VirtualPhone("v"), [], CountingOffline())).sources).flow
    assert sound is not None and len(sound.steps) == 3
    sound.flow_id = "sound"
    provider = CountingOffline()
    off = VirtualPhone("v")
    run = await _run(off, [lazy, sound], provider)
    assert provider.calls == 0 and off.state.flag("dark_theme")
    assert [(d.flow_id, d.flow_step) for d in run.decisions] == [
        ("lazy", 1),
        ("lazy", 2),
        ("sound", 3),
        ("sound", 4),
    ]
    tally = ReplayTally()
    for decision in run.decisions:
        tally.saw(decision)
    report = tally.report()
    assert report is not None and (report.flow_id, report.completed) == ("sound", True)


def _closing(sources: list[SourceStep], reason: str) -> list[SourceStep]:
    """`sources` with its closing `complete` giving `reason`."""
    action = types_pb2.Action()
    action.CopyFrom(sources[-1].action)
    action.complete.reason = reason
    last = dataclasses.replace(
        sources[-1], arguments={**sources[-1].arguments, "reason": reason}, action=action
    )
    return [*sources[:-1], last]


async def test_a_run_that_set_nothing_and_claims_a_state_no_replay_can_check_is_not_learned() -> (
    None
):
    """A run on a phone with dark theme already on opened Display and completed "Dark theme
    already enabled, nothing to do": learned as a flow with no step that turns it on, whose
    closing claim no rule reads (unknown on any screen), so its replay completed with no model
    call on a phone where it was off. Such a run is not learned; one whose claim the replay
    checks is (the flow above hands over where it is not so), and so is a run that turned the
    switch on, however its complete words it. A run that set nothing but says it did the work
    is learned (its tap may have been on the switch's label, not the checkable switch), and so
    is a goal that asks for a place, whatever its complete says was already so."""
    free = "Dark theme already enabled, nothing to do"
    already = VirtualPhone("v")
    already.state.settings["dark_theme"] = True
    lazy = (await _run(already, [], CountingOffline())).sources
    assert [s.tool_name for s in lazy] == ["tap", "tap", "complete"]
    synthesis = synthesize(GOAL, _closing(lazy, free))
    assert synthesis.flow is None
    assert "set nothing" in synthesis.why and free in synthesis.why
    for checkable in ("Dark theme is already enabled.", "Dark theme was already enabled."):
        checked = synthesize(GOAL, _closing(lazy, checkable))
        assert checked.flow is not None and len(checked.flow.steps) == 2, checkable
    said_done = synthesize(GOAL, _closing(lazy, "Turned on dark theme."))
    assert said_done.flow is not None, said_done.why

    sound = (await _run(VirtualPhone("v"), [], CountingOffline())).sources
    learned = synthesize(GOAL, _closing(sound, free)).flow
    assert learned is not None and len(learned.steps) == 3
    # a goal reached by navigating alone ("Open display settings") is learned as it was
    opened = synthesize("Open display settings", _closing(lazy, "Opened the Display settings"))
    assert opened.flow is not None
    running = "Opened the Display settings (the Settings app was already running)."
    opened = synthesize("Open display settings", _closing(lazy, running))
    assert opened.flow is not None, opened.why


async def test_a_closing_claim_the_replays_last_screen_cannot_check_is_no_success() -> None:
    """A run that set nothing was learned because its complete claims a state in a form the
    replay checks ("'Dark mode' is already on"), but the replay only refused a claim the screen
    contradicts: where this phone's Display page has no switch of that name (another app
    version calls it "Dark theme") the check was unknown and the replay completed with
    success, dark theme off, no model call. Now the model takes over at the closing complete
    (counted: the screen is not the one the flow ended on). A flow whose steps set the state
    is not held to its claim's wording: its switch step was checked."""
    already = VirtualPhone("v")
    already.state.settings["dark_theme"] = True
    lazy = (await _run(already, [], CountingOffline())).sources
    renamed = "'Dark mode' is already on."
    flow = synthesize(GOAL, _closing(lazy, renamed)).flow
    assert flow is not None and len(flow.steps) == 2
    flow.flow_id = "lazy"
    provider = CountingOffline()
    off = VirtualPhone("v")
    run = await _run(off, [flow], provider)
    handover = next(d for d in run.decisions if d.planner_mode != "replay")
    assert (handover.flow_id, handover.flow_step) == ("lazy", 3) and provider.calls > 0
    assert "'Dark mode'" in handover.replay_divergence, handover.replay_divergence
    assert "Step 3 (its closing complete) diverged" in handover.user_prompt
    assert run.decisions[-1].arguments["success"] is True and off.state.flag("dark_theme")

    sound = (await _run(VirtualPhone("v"), [], CountingOffline())).sources
    flow = synthesize(GOAL, _closing(sound, renamed)).flow
    assert flow is not None and len(flow.steps) == 3
    flow.flow_id = "sound"
    provider = CountingOffline()
    run = await _run(VirtualPhone("v"), [flow], provider)
    assert provider.calls == 0 and run.decisions[-1].arguments["success"] is True


async def test_a_direct_host_restarted_mid_replay_hands_over_without_a_divergence() -> None:
    """A direct-transport host keeps its attempt's steps in memory: restarted after two
    replayed steps, its planner began the flow again at step 1 on the 'Display' page the first
    run left open, and reported a divergence at step 1 (counted against the flow, three of
    them retired it). The screen is where the flow's step 3 acts: the model takes over, told
    so, and the attempt reports no replay to count."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None and len(flow.steps) == 3
    flow.flow_id = "f1"
    phone = VirtualPhone("v")
    driver, perceiver = VirtualDriver(phone), Perceiver(ocr=None, retry_delay_s=0.0)
    before_restart = DirectPlanner(Planner(CountingOffline()), [flow])
    for _ in range(2):
        scene = perceiver.perceive(driver, False).scene
        decision = await before_restart.decide(GOAL, scene)
        assert decision.planner_mode == "replay"
        assert execute(driver, decision.action, scene).ok

    provider = CountingOffline()
    run = await _run(phone, [flow], provider)  # the new process: a planner with no steps
    first = run.decisions[0]
    assert first.planner_mode == "compact" and provider.calls > 0
    assert (first.flow_id, first.flow_step, first.replay_divergence) == ("f1", 3, "")
    assert first.flow_set_aside == "this screen is where its step 3 acts"
    assert "part-way through it already" in first.user_prompt
    assert "its step 3 acts" in first.user_prompt
    tally = ReplayTally()
    for decision in run.decisions:
        tally.saw(decision)
    assert tally.report() is None  # nothing for the cloud to count
    assert run.decisions[-1].arguments["success"] is True and phone.state.flag("dark_theme")


async def test_a_replay_goes_on_with_a_flow_that_shares_its_start_where_its_own_stops() -> None:
    """The same goal learned twice (once with an interruption after step 1): the replay starts
    on one and, where that one does not fit, goes on with the other instead of the model."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    plain = synthesize(GOAL, learned.sources).flow
    assert plain is not None
    plain.flow_id = "plain"
    interrupted = types_pb2.Flow()
    interrupted.CopyFrom(plain)
    interrupted.flow_id = "interrupted"
    wait = interrupted.steps[1]
    wait.target.CopyFrom(types_pb2.ElementTarget(text="Wait", class_name="android.widget.Button"))
    wait.purpose, wait.expected_outcome = "wait on 'System UI isn't responding'", "it closes"
    provider = CountingOffline()
    phone = VirtualPhone("v")
    run = await _run(phone, [interrupted, plain], provider)
    assert provider.calls == 0 and phone.state.flag("dark_theme")
    assert [d.flow_id for d in run.decisions] == ["interrupted"] + ["plain"] * (
        len(run.decisions) - 1
    )


async def test_a_flow_withdrawn_mid_replay_is_replayed_no_further_by_the_direct_transport() -> None:
    """A direct-transport host replayed what its assignment carried to its end, though an
    operator had disabled the flow meanwhile (`amc flows disable`: "Stop replaying a flow").
    The cloud now names it in the next renewal (`Renewed.withdrawn_flows`, added to the
    attempt's `TaskSpec.withdrawn_flows`): the next step is the model's."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None
    flow.flow_id = "f1"
    phone = VirtualPhone("v")
    driver, perceiver = VirtualDriver(phone), Perceiver(ocr=None, retry_delay_s=0.0)
    withdrawn: set[str] = set()
    provider = CountingOffline()
    planner = DirectPlanner(Planner(provider), [flow], withdrawn=withdrawn)
    history: list[WorldEvent] = []
    modes = []
    for _ in range(30):
        scene = perceiver.perceive(driver, False).scene
        decision = await planner.decide(GOAL, scene, history)
        modes.append(decision.planner_mode)
        result = execute(driver, decision.action, scene)
        history.append(WorldEvent.from_decision(decision, page=scene.page, success=result.ok))
        withdrawn.add("f1")  # a renewal after the first step said the flow was disabled
        if decision.tool_name == "complete":
            break
    assert modes[0] == "replay"
    assert set(modes[1:]) == {"compact"} and provider.calls > 0
    assert phone.state.flag("dark_theme")


def _tapped_by_point(run: Run) -> list[SourceStep]:
    """The run's steps as a model that taps by coordinates would have logged them: each tap at
    its element's centre, its target what `plan_step` records for such a tap."""
    out = []
    for source, scene in zip(run.sources, run.scenes, strict=True):
        element = scene.element(source.arguments.get("element_id", ""))
        if source.tool_name != "tap" or element is None:
            out.append(source)
            continue
        action = types_pb2.Action()
        action.CopyFrom(source.action)
        x, y = element.bounds.center
        action.tap.point.x, action.tap.point.y = x, y
        out.append(
            dataclasses.replace(
                source, arguments={"x": x, "y": y}, action=action, target=describe(scene, action)
            )
        )
    return out


async def test_a_tap_by_point_replays_on_a_phone_of_another_size_or_rotation() -> None:
    """A flow that tapped by coordinates replayed them as they were: on a smaller phone the
    launcher's Settings point (135, 1308) opened the Phone app, and the model, handed a wrong
    app, failed the task. The point is now kept on the element under it and replayed there."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, _tapped_by_point(learned)).flow
    assert flow is not None
    flow.flow_id = "f1"
    taps = [s for s in flow.steps if s.tool_name == "tap"]
    assert taps and all(s.action.tap.WhichOneof("target") == "point" for s in taps)
    for phone in (VirtualPhone("v"), VirtualPhone("v", width=1440, height=3120)):
        before = snapshot(phone)
        provider = CountingOffline()
        run = await _run(phone, [flow], provider)
        assert provider.calls == 0, [d.replay_divergence for d in run.decisions]
        assert {d.planner_mode for d in run.decisions} == {"replay"}
        changed = {k for k, v in snapshot(phone).items() if before.get(k) != v}
        assert changed == {"settings.dark_theme"}

    # smaller, or turned to landscape (the launcher's point is then off the screen): the
    # launcher tap lands on Settings, and the replay hands over where the row it taps next is
    # below the fold, as a flow of element taps does
    smaller = VirtualPhone("v", width=720, height=1600)
    turned = VirtualPhone("v")
    turned.rotate(1)
    for phone in (smaller, turned):
        before = snapshot(phone)
        run = await _run(phone, [flow], CountingOffline())
        assert run.decisions[0].planner_mode == "replay"
        assert run.scenes[1].package == "com.android.settings", run.scenes[1].page
        handover = next(d for d in run.decisions if d.replay_divergence)
        assert "its target is not here" in handover.replay_divergence
        changed = {k for k, v in snapshot(phone).items() if before.get(k) != v}
        assert changed == {"settings.dark_theme"}

    # a point no element holds cannot be placed: the model takes that step, none is guessed
    for step in taps:
        step.ClearField("target")
    provider = CountingOffline()
    run = await _run(VirtualPhone("v", width=720, height=1600), [flow], provider)
    assert run.decisions[0].planner_mode == "compact" and provider.calls > 0
    assert "cannot be placed" in run.decisions[0].replay_divergence


async def test_a_run_that_tapped_a_point_no_element_holds_is_not_learned() -> None:
    """A tap by coordinates is replayed on the element under it, found again by its target; a
    point no element held has no target, and the replay can only hand over there. Learned, such
    a flow counted a divergence at that step on every use until it was retired."""
    learned = _tapped_by_point(await _run(VirtualPhone("v"), [], CountingOffline()))
    taps = [i for i, s in enumerate(learned) if s.tool_name == "tap"]
    assert len(taps) > 1 and synthesize(GOAL, learned).flow is not None
    second = learned[taps[1]]
    off = [*learned[: taps[1]], dataclasses.replace(second, target=None), *learned[taps[1] + 1 :]]
    made = synthesize(GOAL, off)
    assert made.flow is None
    assert made.why == (
        f"step {second.step_index} taps a point no element holds, which a replay cannot place"
    )
    # such a tap that did not run is no step of the flow, and keeps none from being learned
    failed = dataclasses.replace(second, target=None, step_index=99, executed=False)
    assert synthesize(GOAL, [*learned[: taps[1]], failed, *learned[taps[1] :]]).flow is not None


async def test_a_run_that_swiped_outside_any_list_is_not_learned() -> None:
    """A swipe is replayed relative to the list it moved; one that moved no list (a swipe on
    the launcher's background) has no target, and its replay can only hand over there."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    action = types_pb2.Action()
    action.swipe.start.x, action.swipe.start.y = 540, 1800
    action.swipe.end.x, action.swipe.end.y = 540, 600
    arguments = {"start_x": 540, "start_y": 1800, "end_x": 540, "end_y": 600}
    page = learned.sources[0].page
    swipe = SourceStep(0, "swipe", arguments, action, None, "look", "more shown", page, "met")
    made = synthesize(GOAL, [swipe, *learned.sources])
    assert made.flow is None
    assert made.why == "step 0 swipes outside any list, which a replay cannot place"
    # the same swipe on a list it moved is learned, to be replayed on that list
    target = types_pb2.ElementTarget(class_name="android.widget.ListView", alike_count=1)
    target.bounds.right, target.bounds.bottom = 1080, 2000
    listed = dataclasses.replace(swipe, target=target)
    assert synthesize(GOAL, [listed, *learned.sources]).flow is not None


async def test_a_try_the_model_made_again_is_not_learned_as_a_step_of_its_own() -> None:
    """A run whose tap on 'Display' did nothing the first time (found not met) and worked when
    the model tapped again taught both taps: every replay tapped 'Display', reached it, and
    handed over there because the flow expected to be still on 'Settings' for its second tap."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    plain = synthesize(GOAL, learned.sources)
    assert plain.flow is not None
    display = next(
        i for i, s in enumerate(learned.sources) if s.target and "Display" in str(s.target)
    )
    missed = dataclasses.replace(learned.sources[display], verdict="not_met")
    retried = synthesize(GOAL, [*learned.sources[:display], missed, *learned.sources[display:]])
    assert retried.flow is not None
    assert retried.fingerprint == plain.fingerprint  # the same path: one flow
    flow = retried.flow
    flow.flow_id = "f1"
    phone = VirtualPhone("v")
    before = snapshot(phone)
    provider = CountingOffline()
    run = await _run(phone, [flow], provider)
    assert provider.calls == 0, [d.replay_divergence for d in run.decisions]
    assert {d.planner_mode for d in run.decisions} == {"replay"}
    assert {k for k, v in snapshot(phone).items() if before.get(k) != v} == {"settings.dark_theme"}

    # a step found not met that the model followed with something else is kept
    assert synthesize(GOAL, learned.sources[-1:]).why == "no device action to replay"
    kept = synthesize(GOAL, [missed, *learned.sources])
    assert kept.flow is not None and len(kept.flow.steps) == len(plain.flow.steps) + 1


def test_a_goal_that_goes_both_ways_does_not_get_a_flow_that_went_one() -> None:
    """ "Turn on dark theme and then turn it off" scored 1.0 against the flow for "Turn on
    dark theme" (its direction words weigh nothing in the score, and it was not the flow's
    opposite, as it also says "on"): its replay turned dark theme on and reported success for
    half of the goal. A goal that goes both ways asks more than a flow that went one way."""
    dark = dark_theme_flow()
    scorer = LexicalScorer([Candidate("dark", dark.goal_template, dark.embedding_text)])
    for goal in ("Turn on dark theme and then turn it off", "Enable dark theme, then disable it"):
        (scored,) = scorer.score(goal)
        assert not scored.usable and "both ways" in scored.why, (goal, scored)
    for goal in ("Turn dark theme on", "Enable dark theme on my phone", "Turn on dark theme"):
        (scored,) = scorer.score(goal)
        assert scored.usable, (goal, scored)


def test_a_goal_that_goes_on_past_a_slot_value_does_not_get_that_flow() -> None:
    """The last slot takes the rest of the goal: "Create a contact named Bob, then delete it"
    bound p1 = "Bob, then delete it" to a flow for "Create a contact named {p1}", scored 1,
    and the replay made a contact of that name and reported the goal reached."""
    contact = Candidate("contact", "Create a contact named {p1}", "", ("p1",))
    alarm = Candidate("alarm", "Set an alarm for {p1}", "", ("p1",))
    for candidate, goal in [
        (contact, "Create a contact named Bob, then delete it"),
        (contact, "Create a contact named Bob and call him"),
        (contact, "Create a contact named Bob in the Notes app"),
        (alarm, "Set an alarm for 7:00 and turn on dark theme"),
    ]:
        values, why = bound(candidate, goal)
        assert "goes on past its value for p1" in why, (goal, values)
        (scored,) = LexicalScorer([candidate]).score(goal)
        assert not scored.usable
    for goal, name in [
        ("Create a contact named Tom and Jerry", "Tom and Jerry"),
        ("Create a contact named Stop Watch", "Stop Watch"),
        ("Create a contact named Ada Lovelace, please", "Ada Lovelace"),
    ]:
        assert bound(contact, goal) == ({"p1": name}, ""), goal


async def test_a_label_whose_case_changed_is_found_and_one_in_another_language_hands_over() -> None:
    """A flow learned when the row read "display" handed over where the app now says "Display"
    (every replay, so its divergences retired it): a label's case and spacing are cosmetic.
    Another language is not the same label: the replay hands over there, tapping nothing."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None
    flow.flow_id = "f1"
    display = next(s for s in flow.steps if s.target.row_label == "Display")
    display.target.row_label = "  display "
    provider = CountingOffline()
    run = await _run(VirtualPhone("v"), [flow], provider)
    assert provider.calls == 0, [d.replay_divergence for d in run.decisions]

    display.target.row_label = "Anzeige"
    phone = VirtualPhone("v")
    run = await _run(phone, [flow], CountingOffline())
    handover = next(d for d in run.decisions if d.replay_divergence)
    assert handover.flow_step == display.index
    assert "no element 'Anzeige'" in handover.replay_divergence
    assert phone.state.flag("dark_theme")  # the model took it from there


async def test_a_phone_in_another_language_sets_the_flow_aside_without_a_divergence() -> None:
    """A flow learned on an English phone handed over at step 1 on a German one ('Settings'
    is 'Einstellungen' there) as a divergence: three German phones retired it for every
    phone. The phone's language is its setting, not a changed app: the model takes over with
    the flow set aside (said why), and nothing is counted against it. On an English phone
    whose app renamed a label, the handover is still a divergence."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None
    flow.flow_id = "f1"
    assert language.of_flow(flow) == "English"
    german = VirtualPhone("v", locale="de-DE")
    scene = Perceiver(ocr=None, retry_delay_s=0.0).perceive(VirtualDriver(german), False).scene
    assert language.guess(labels.screen_texts(scene)) == "German"
    provider = CountingOffline()
    run = await _run(german, [flow], provider)
    first = run.decisions[0]
    assert provider.calls > 0 and first.planner_mode != "replay"
    assert (first.flow_id, first.flow_step, first.replay_divergence) == ("f1", 1, "")
    assert "this screen is in German, the flow was learned in English" in first.flow_set_aside
    assert "German" in first.user_prompt and "Step 1 was not replayed" in first.user_prompt
    tally = ReplayTally()
    for decision in run.decisions:
        tally.saw(decision)
    report = tally.report()
    assert report is None or not report.diverged

    next(s for s in flow.steps if s.target.row_label == "Display").target.row_label = "Screen"
    run = await _run(VirtualPhone("v"), [flow], CountingOffline())
    handover = next(d for d in run.decisions if d.planner_mode != "replay")
    assert "its target is not here" in handover.replay_divergence
    assert not handover.flow_set_aside


async def test_a_system_dialog_in_the_way_sets_the_flow_aside_without_a_divergence() -> None:
    """A permission prompt over the launcher when the replay began: step 1 "diverged" (the
    flow expects the launcher) and was counted, so three phones that happened to show a
    system dialog retired a sound flow. A screen a system dialog covers is the phone's
    moment, not a changed app: the model takes over (it answers the dialog and goes on) with
    the flow set aside, nothing counted."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None
    flow.flow_id = "f1"
    phone = VirtualPhone("v")
    phone.show_permission_prompt(SETTINGS)
    provider = CountingOffline()
    run = await _run(phone, [flow], provider)
    first = run.decisions[0]
    assert provider.calls > 0 and first.planner_mode != "replay"
    assert (first.flow_id, first.flow_step, first.replay_divergence) == ("f1", 1, "")
    assert "a permission prompt covers the app" in first.flow_set_aside, first.flow_set_aside
    assert "Step 1 was not replayed" in first.user_prompt
    assert run.decisions[-1].arguments["success"] is True and phone.state.flag("dark_theme")


async def test_a_phone_left_on_another_screen_than_the_flow_starts_from_counts_nothing() -> None:
    """A phone left in another app (or in Settings scrolled down) when the task began: step 1
    "diverged" (the flow expects the launcher) and was counted, so three phones left where
    their last user left them retired a sound flow. Where a replay starts is where the phone
    was left, and nothing was replayed: the flow is set aside for it, said why, counted
    nowhere. A first screen that is the flow's but lacks its target still counts."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None
    flow.flow_id = "f1"
    contacts = VirtualPhone("v")
    contacts.launch(CONTACTS)
    scrolled = VirtualPhone("v")
    scrolled.launch(SETTINGS)
    scrolled.current_page().scroll["list"] = 10_000
    for phone in (contacts, scrolled):
        provider = CountingOffline()
        run = await _run(phone, [flow], provider)
        first = run.decisions[0]
        assert first.planner_mode == "compact" and provider.calls > 0
        assert (first.flow_id, first.flow_step, first.replay_divergence) == ("f1", 1, "")
        assert "the phone is not where the flow starts" in first.flow_set_aside
        assert "the flow expects" in first.flow_set_aside
        assert "Step 1 was not replayed" in first.user_prompt
        assert run.decisions[-1].arguments["success"] is True and phone.state.flag("dark_theme")


async def test_an_english_screen_showing_a_users_notes_in_german_is_not_another_language() -> None:
    """An English phone whose user writes notes in German: its Notes list is English chrome
    ('Notes', 'Search notes', 'New note') over the user's own words. The language guess read it
    as German, so a real divergence there (the app renamed its 'New note' button) was set aside
    uncounted on that phone, on every replay: a flow the app broke was never retired by it. The
    page is the one the flow recorded, under the flow's own title: its language is the flow's."""
    goal = 'Create a note titled "Groceries" that says "milk and eggs"'
    fresh = VirtualPhone("v")
    fresh.launch(NOTES)
    flow = synthesize(goal, (await _run(fresh, [], CountingOffline(), goal)).sources).flow
    assert flow is not None and language.of_flow(flow) == "English"
    flow.flow_id = "n1"
    button = next(s for s in flow.steps if s.target.content_description == "New note")
    button.target.content_description = "Add note"  # another app version's label
    phone = VirtualPhone("v")
    phone.launch(NOTES)
    phone.state.notes += [
        Note("Einkaufsliste", "Milch und Eier"),
        Note("Termin", "mit Oma nach Bonn"),
        Note("Die Bücher", "für Tom zurück"),
        Note("Anruf von der Bank", ""),
        Note("Das Auto", "zum TÜV"),
    ]
    run = await _run(phone, [flow], CountingOffline(), goal)
    handover = next(d for d in run.decisions if d.planner_mode != "replay")
    assert handover.flow_id == "n1" and not handover.flow_set_aside, handover.flow_set_aside
    assert "its target is not here" in handover.replay_divergence


async def test_a_flow_the_app_broke_at_step_1_is_counted_behind_one_that_starts_elsewhere() -> None:
    """Two flows for the goal: one learned on a phone left in Contacts (it starts there), one
    from the launcher whose first target the app renamed. On a phone at the launcher the first
    is set aside uncounted (the phone is not where it starts) and, as the replay reported only
    the first candidate's handover, the second's real divergence (its first page is here, its
    target is not: the app changed, 0089) was counted nowhere: ranked behind a flow that
    starts elsewhere, a broken flow was never retired."""
    learned = await _run(VirtualPhone("v"), [], CountingOffline())
    flow = synthesize(GOAL, learned.sources).flow
    assert flow is not None
    elsewhere = types_pb2.Flow()
    elsewhere.CopyFrom(flow)
    elsewhere.flow_id = "elsewhere"
    elsewhere.steps[0].page_before = f"{CONTACTS}: Contacts"
    broken = types_pb2.Flow()
    broken.CopyFrom(flow)
    broken.flow_id = "broken"
    broken.steps[0].target.text = "Device settings"  # another launcher's label
    run = await _run(VirtualPhone("v"), [elsewhere, broken], CountingOffline())
    first = run.decisions[0]
    assert (first.flow_id, first.flow_step) == ("broken", 1), first.flow_set_aside
    assert "its target is not here" in first.replay_divergence and not first.flow_set_aside


def test_a_flow_whose_button_set_the_state_is_not_held_to_a_switch_on_its_last_screen() -> None:
    """Android's Do Not Disturb page turns it on with a button ('Turn on now'), not a switch:
    the run set the state with a tap on no checkable element and completed "'Do Not Disturb'
    is on". Learned (its complete does not say it found the state already so), its replay
    completed. The rule for a flow that set nothing (53468de9) took every such flow for one
    that found its state already set: with no switch of that name on the last screen the claim
    is unknown, and each replay handed over at its closing complete, counted: three replays
    retired a sound flow. The rule is for a run that says it found the state already so, as
    the one that learns it (`synthesis`)."""

    dnd = "com.android.settings: Do Not Disturb"
    sound = "com.android.settings: Sound & vibration"
    source = [
        made._tap(1, made.LAUNCHER, made._target("Settings"), "open 'Settings'", "Settings"),
        made._tap(2, made.SETTINGS, made._target("Sound & vibration"), "open sound", "Sound"),
        made._tap(3, sound, made._target("Do Not Disturb"), "open DND", "the DND page"),
        made._tap(4, dnd, made._target("Turn on now"), "turn it on", "Do Not Disturb is on"),
        made._complete(5, dnd, "'Do Not Disturb' is on"),
    ]
    flow = synthesize("Turn on Do Not Disturb", source).flow
    assert flow is not None
    flow.flow_id = "dnd"
    done = [
        PastStep(
            i,
            s.page,
            "tap",
            "{}",
            None,
            s.purpose,
            s.expected_outcome,
            None,
            StepOutcome(True, verdict="met"),
            "replay",
            "dnd",
            i,
        )
        for i, s in enumerate(source[:-1], 1)
    ]
    scene = Scene(
        [
            el(1, "Do Not Disturb", (176, 96, 900, 272)),
            el(2, "On", (48, 300, 1000, 380)),
            el(3, "Turn off now", (48, 400, 500, 500), clickable=True),
        ],
        "com.android.settings",
        "Do Not Disturb",
        W,
        H,
    )
    move = replay([flow], done, scene)
    assert move is not None
    assert move.handover is None, move.handover.line
    assert move.decision is not None and move.decision.tool_name == "complete"


def test_on_as_a_preposition_does_not_make_a_goal_go_both_ways() -> None:
    """ "Turn off Wi-Fi on my phone" goes one way: its "on" says where, not which way. The
    both-ways rule (aeb4a6ae) counted it a direction, so the flow for "Turn off Wi-Fi" (and one
    for "Turn off lock screen notifications", scored 1.0) was unusable for a goal it fits; the
    rule's own test tried "Enable dark theme on my phone" only, where "on" goes the same way.
    A goal that does go both ways still gets no one-way flow."""
    cases = [
        ("Turn off Wi-Fi on my phone", "Turn off Wi-Fi", True),
        ("Turn off notifications on the lock screen", "Turn off lock screen notifications", True),
        ("Delete the alarm on Monday", "Delete the alarm for {p1}", True),
        ("Turn on the flashlight and turn off Wi-Fi", "Turn off Wi-Fi", False),
        ("Turn off Wi-Fi, then switch on the hotspot", "Turn off Wi-Fi", False),
    ]
    for goal, template, usable in cases:
        (scored,) = LexicalScorer([Candidate("f", template, template)]).score(goal)
        assert scored.usable is usable, (goal, template, scored)
