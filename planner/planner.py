"""`Planner`: compact mode — one self-contained request per step, decided by `planner.deciding`.

The conversation of a compact decision lives in memory: the prompt, and a model answer only when
a correction has to send it back. The adapter projects it onto the vendor's wire format.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from planner import deciding
from planner.conversation.items import AssistantItem, SessionItem, UserObservation
from planner.conversation.turns import ModelTurn, segment
from planner.decision import Decision
from planner.history import WorldEvent
from planner.model_profiles import RetryForm
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from planner.scene import Scene
from planner.settings import PlannerSettings
from planner.tools import TOOLS
from planner.vendors.base import ModelAdapter, Turn, TurnRequest


class PromptConversation:
    """A compact decision's conversation: the prompt, then an answer and its correction only
    when one is needed. The forced retry asks the prompt again (the answer without a call is
    not sent back); a nudge sends that answer back with the instruction."""

    def __init__(self, system: str, user_prompt: str, screenshot: bytes | None) -> None:
        self.system = system
        self.items: list[SessionItem] = [UserObservation(user_prompt)]
        self._images = {0: screenshot} if screenshot else {}
        self._pending: list[AssistantItem] = []

    def request(self, *, forced: bool, thinking: bool) -> TurnRequest:
        return TurnRequest(
            system=self.system,
            items=list(self.items),
            tools=TOOLS,
            mode="compact",
            forced=forced,
            thinking=thinking,
            images=self._images,
        )

    def thinking_allowed(self) -> bool:
        # Anthropic rejects a thinking turn whose previous tool_use turn carried none.
        return all(s.reasoning for s in segment(self.items) if isinstance(s, ModelTurn))

    async def received(self, turn: Turn) -> None:
        self._pending = list(turn.items)

    async def before_retry(self, form: RetryForm, nudge: str) -> None:
        if form == "forced":
            self._pending = []
        else:
            await self.add([UserObservation(nudge, kind="instruction")])

    async def add(self, items: Sequence[SessionItem]) -> None:
        self.items.extend(self._pending)
        self._pending = []
        self.items.extend(items)


class Planner:
    """Builds prompts, asks the model and turns the answer into a validated `Decision`."""

    def __init__(self, provider: ModelAdapter, settings: PlannerSettings | None = None) -> None:
        self.provider = provider
        self.settings = settings or PlannerSettings()

    async def aclose(self) -> None:
        await self.provider.aclose()

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
        note: str | None = None,
    ) -> Decision:
        """The next action for `goal` on `scene`, given the compact `history` of earlier steps
        (and a `note` for the prompt: a replay handing over)."""
        user_prompt = build_user_prompt(
            goal, scene, history, history_window=self.settings.history_window, note=note
        )
        return await self.decide_from_prompts(
            SYSTEM_PROMPT,
            user_prompt,
            element_ids=[e.element_id for e in scene.elements],
            screen_size=(scene.screen_width, scene.screen_height),
            screenshot=screenshot,
        )

    async def decide_from_prompts(
        self,
        system_prompt: str,
        user_prompt: str,
        element_ids: Collection[str] | None = None,
        screen_size: tuple[int, int] | None = None,
        screenshot: bytes | None = None,
    ) -> Decision:
        """The same decision from ready-made prompts (the cloud's Decide service uses this).

        `element_ids`/`screen_size` say what the model was shown so a call on something that is
        not there is caught; None skips that check. A `screenshot` goes to the model only when
        the settings send screenshots (`send_screenshot`), the rule of every path: a model
        without image input (o3-mini, o1-mini) is refused that setting at start, and a host's
        screenshot it got anyway on the prompt path was a provider 400 and a failed step.
        """
        shot = screenshot if self.settings.send_screenshot else None
        decision, _turns = await deciding.decide(
            self.provider,
            PromptConversation(system_prompt, user_prompt, shot),
            system_prompt=system_prompt,
            user_prompt=user_prompt,
            element_ids=element_ids,
            screen_size=screen_size,
        )
        return decision


def make_planner(settings: PlannerSettings | None = None) -> Planner:
    """A Planner with the model the settings (or the environment) select."""
    from planner.providers import make_provider

    settings = settings or PlannerSettings()
    return Planner(make_provider(settings), settings)
