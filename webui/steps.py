"""How both consoles and the command line say what a step did, never the task's status: a
failed task whose last step ran its "give up" action reads "last step 6 · action done · give
up: …" beside a "failed" status, not "succeeded". Here, not in `console`, because the host's
console says it too and the two consoles depend on `webui`, not on each other.
`console/gateway/static/live.js` repeats `step_line` for live updates.
"""

from __future__ import annotations

#: What a step is doing, by StepStatus word: never a task status word.
STEP_WORDS = {
    "perceiving": "looking at the screen",
    "planning": "planning",
    "acting": "acting",
    "succeeded": "action done",
    "failed": "action failed",
}


def step_line(
    step_index: int, step_status: str, summary: str, max_steps: int, *, terminal: bool
) -> str:
    """`step 4 of at most 30 · acting · tap 'Display'`, `last step 6 · action done · give up:
    …` once the task ended; before the first step only its summary, if any (a task queued
    again says why it waits: "re-queued after attempt 1 ended: lease expired"). The agent
    loop's summaries start with "step N: ", which is not repeated."""
    if not step_index:
        return summary
    if terminal:
        parts = [f"last step {step_index}"]
    else:
        at_most = f" of at most {max_steps}" if max_steps else ""
        parts = [f"step {step_index}{at_most}"]
    word = STEP_WORDS.get(step_status)
    if word:
        parts.append(word)
    text = summary.removeprefix(f"step {step_index}: ")
    if text and text != word:  # "looking at the screen" is both the status and the summary
        parts.append(text)
    return " · ".join(parts)
