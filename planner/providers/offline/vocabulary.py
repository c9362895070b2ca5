"""The words the offline agent knows: the little general phone vocabulary any model has.

English, with the German a German phone shows for the same things (the agent reads the screen
it is given; it does not translate). Nothing here names a task of any suite: these are the
words people and phones use for settings, buttons and dialogs.
"""

from __future__ import annotations

import re


def _words(*lines: str) -> frozenset[str]:
    return frozenset(" ".join(lines).split())


#: Words that carry no meaning for matching (articles, pronouns, verbs of wanting or doing).
STOP = _words(
    "a an the to on off in of for and or with my me please turn switch set setting",
    "enable disable activate deactivate make sure that is it be go open app its this",
    "into from at as by can you up named called number new value labeled labelled",
    "label page i i'd id want would like need let get put keep show display use using",
    "titled title say says saying text reading",
    # German
    "der die das den dem des ein eine einen einem einer bitte schalte schalten schalt",
    "aktiviere aktivieren deaktiviere deaktivieren mach mache machen stelle stell stellen",
    "auf fur für mit und dann zu im am mein meine meinen ich möchte will aus an ein ein",
)
#: Words too common in setting names to tell one from another ("Airplane mode", "Dark
#: theme", "Screen timeout"): they count, but little.
GENERIC = _words("mode setting settings screen option options feature use format show display")
#: Different words for one thing ("dark mode" is what the Settings app calls "Dark theme").
SYNONYMS: dict[str, frozenset[str]] = {
    "mode": frozenset({"theme"}),
    "theme": frozenset({"mode"}),
    "wifi": frozenset({"wlan", "wireless", "internet"}),
    "wlan": frozenset({"wifi"}),
    "percentage": frozenset({"percent"}),
    "percent": frozenset({"percentage"}),
    "airplane": frozenset({"flight", "aeroplane", "plane"}),
    "flight": frozenset({"airplane"}),
    "vibrate": frozenset({"vibration"}),
    "rotate": frozenset({"rotation", "autorotate"}),
    "autorotate": frozenset({"rotate"}),
    "automatic": frozenset({"automatically", "auto"}),
    "automatically": frozenset({"automatic", "auto"}),
}
# Where things usually live on Android (a hint, weaker than a direct match).
RELATED: dict[str, tuple[str, ...]] = {
    "dark": ("display", "theme"),
    "theme": ("display",),
    "brightness": ("display",),
    "font": ("display",),
    "timeout": ("display",),
    "rotate": ("display",),
    "autorotate": ("display",),
    "rotation": ("display",),
    "wifi": ("network", "internet"),
    "airplane": ("network", "internet"),
    "hotspot": ("network", "internet"),
    "data": ("network", "internet"),
    "bluetooth": ("connected", "device"),
    "nfc": ("connected", "device"),
    "volume": ("sound",),
    "ringtone": ("sound",),
    "vibrate": ("sound", "vibration"),
    "vibration": ("sound",),
    "disturb": ("sound",),
    "saver": ("battery",),
    "percentage": ("battery",),
    "alarm": ("clock",),
    "timer": ("clock",),
    "stopwatch": ("clock",),
    "contact": ("contacts", "people"),
    "location": ("location",),
    "gps": ("location",),
    "language": ("system",),
    "date": ("system",),
    "time": ("system",),
    "note": ("notes",),
    # German
    "wlan": ("netzwerk", "internet"),
    "flugmodus": ("netzwerk", "internet"),
    "energiesparmodus": ("akku",),
    "akkustand": ("akku",),
    "design": ("display",),
    "dunkles": ("display",),
    "schriftgröße": ("display",),
    "standort": ("standort",),
    "wecker": ("uhr",),
    "kontakt": ("kontakte",),
}
SETTING_WORDS = (
    frozenset(RELATED)
    | frozenset(w for targets in RELATED.values() for w in targets)
    | {"mode", "toggle", "battery", "setting", "preference", "about", "storage", "accessibility"}
    | {"notification", "privacy", "security", "wallpaper", "system", "timeout", "screen"}
    | {"percentage", "saver", "modus", "einstellung"}
) - {"clock", "contacts", "people", "notes", "uhr", "kontakte"}
#: What the Settings app is called on a launcher, in the languages a phone may be set to.
SETTINGS_APP_NAMES = frozenset({"setting", "einstellungen", "einstellung", "paramètre", "ajuste"})

# On/off, wherever the words sit: "turn off X", "turn X off", "switch X on", "disable X",
# "I want X", "show X", "put the phone in X mode"; German "schalte X aus/ein", "aktiviere X".
_PARTICLE_END = r"(?=\s*(?:$|[,.;!?]|\band\b|\bthen\b|\bplease\b|\bnow\b))"
_VERB = r"\b(?:turn|switch|toggle|flip|set|put|keep|shut|schalte|schalt|stelle|mach|mache)\b"
OFF = re.compile(
    rf"{_VERB}\s+off\b|{_VERB}[^,.;!?]*?\b(?:off|aus){_PARTICLE_END}"
    r"|\b(?:disable|deactivate|stop|hide|don't show|do not show|no more|mute|ausschalten"
    r"|deaktivier\w*|abschalten)\b",
    re.I,
)
ON = re.compile(
    rf"{_VERB}\s+on\b|{_VERB}[^,.;!?]*?\b(?:on|ein|an){_PARTICLE_END}"
    r"|\b(?:enable|activate|start using|unmute|einschalten|aktivier\w*|anschalten)\b",
    re.I,
)
#: Softer "on": wanting a thing, showing it, putting the phone in a mode.
SOFT_ON = re.compile(
    r"\b(?:want|need|use|show|display|i'd like)\b|\bput\b.*\bin(?:to)?\b.*\bmode\b"
    r"|\bswitch to\b|\bgo into\b",
    re.I,
)

#: Controls that make something new: never the way to a goal that removes something.
CREATIVE = _words("create add new compose erstellen hinzufügen neu neue")
DESTRUCTIVE = frozenset(
    {"delete", "remove", "trash", "erase", "reset", "clear", "uninstall", "löschen", "entfernen"}
)
HOME_GOAL = re.compile(r"\b(home screen|go home|return home|back home|launcher)\b", re.I)
LEAVE_GOAL = re.compile(r"^\s*(leave|exit|close|quit)\b", re.I)
VERBS = _words(
    "turn switch enable disable set open go return create add delete remove leave exit",
    "close use stop start make change put select show",
)
SAVE_WORDS = (
    "save",
    "done",
    "ok",
    "create",
    "add",
    "set",
    "apply",
    "confirm",
    "submit",
    # The buttons that send a filled sign-in or join form ("Sign in", "Log in", "Connect").
    "sign",
    "login",
    "log",
    "connect",
    "join",
    "speichern",
    "fertig",
    "anmelden",
    "verbinden",
)
#: A field's kind from the words of its hint, id or label.
FIELD_KINDS: dict[str, tuple[str, ...]] = {
    "first": ("first", "vorname"),
    "last": ("last", "surname", "family", "nachname"),
    "name": ("name",),
    "phone": ("phone", "number", "mobile", "tel", "telefon", "nummer"),
    "email": ("email", "mail"),
    "hour": ("hour", "stunde"),
    "minute": ("minute",),
    "ampm": ("ampm",),
    "title": ("title", "subject", "heading", "titel"),
    "body": ("note", "body", "message", "content", "notiz", "nachricht"),
    "label": ("label", "tag", "caption"),
    "password": ("password", "pin", "passcode", "code"),
}
#: Where a value goes when no field is of its own kind ("label" into an alarm's "name").
FIELD_FALLBACK: dict[str, tuple[str, ...]] = {
    "label": ("name", "title"),
    "title": ("label", "name"),
    "name": ("label", "title"),
    "body": ("label",),
}

# Dialogs: what their buttons say.
DENY = (
    "don't allow",
    "don’t allow",
    "deny",
    "not now",
    "no thanks",
    "nicht zulassen",
    "ablehnen",
    "cancel",
    "abbrechen",
)
ALLOW = ("allow", "zulassen", "while using the app", "only this time")
WAIT = ("wait", "warten")
DISMISS = ("ok", "close", "dismiss", "got it", "schließen", "cancel", "abbrechen")
#: Goal words that mean "answer yes" to a permission prompt.
GRANT_WORDS = _words("allow grant permit permission access erlauben zulassen")
