"""Make what real dumpers emit into well-formed XML before parsing it.

Real tools produce dumps a strict XML parser refuses; each fix here is for one of them:

* `adb exec-out uiautomator dump /dev/tty` prints the XML and then, on the same stream,
  `UI hierchary dumped to: /dev/tty` (Android's own spelling): text after the root is cut off,
  and so is anything printed before it.
* Text nodes hold control characters, raw or as character references (`&#1;`): both are
  invalid in XML 1.0 (AOSP's dumper turns them into ".", androidx's serializer writes `&#1;`).
  They are removed.
* A dumper that escapes UTF-16 units one by one writes an emoji as two surrogate
  references (`&#55357;&#56832;`): the pair is joined into one character first.
* Some dumpers declare `encoding="utf-16"` over a UTF-8 body: the declaration is dropped and
  the text, already decoded by the driver, is parsed as it is.
* Some ROMs' and apps' dumpers write `&`, `<` and `"` in texts unescaped ("Network &
  internet", `Tap "Allow"`), which no XML parser reads: `repair_dump` escapes them, and only
  them, inside attribute values (a dump's texts are all attributes), and says so; a
  well-formed dump has none.
"""

from __future__ import annotations

import re

_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")
_ROOT_NAME = re.compile(r"\s*<([A-Za-z_][\w.-]*)")
# Characters XML 1.0 does not allow (tab, line feed and carriage return are allowed).
_INVALID_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_CHAR_REF = re.compile(r"&#(x[0-9A-Fa-f]+|[0-9]+);")
# A `&` that starts no reference XML knows (its five entities, a character reference).
_BARE_AMP = re.compile(r"&(?!(?:amp|lt|gt|quot|apos|#[0-9]+|#x[0-9A-Fa-f]+);)")
# What follows the `"` that ends an attribute value: another attribute, or the tag's end.
_VALUE_END = r"""\s+[\w:.-]+=["']|\s*[/?]?>"""
# A double-quoted attribute value (every dumper quotes them so): it ends at the first `"`
# that another attribute or the tag's end follows, so a raw `"` inside a text stays in it.
_VALUE = re.compile(rf'="([^"]*(?:"(?!{_VALUE_END})[^"]*)*)"(?={_VALUE_END})')
# A value holding `<` or `&` (cheap to look for; `_VALUE` over a whole dump is not).
_MARKUP_IN_VALUE = re.compile(r'="[^"<&]*[<&]')


def _stray_quotes(text: str) -> bool:
    """Whether some `"` neither opens nor ends a value: in a well-formed dump each `="` opens
    one that one more `"` ends, and counting is far cheaper than matching every value."""
    return text.count('"') != 2 * text.count('="')


def _valid_code_point(cp: int) -> bool:
    return (
        cp in (0x9, 0xA, 0xD)
        or 0x20 <= cp <= 0xD7FF
        or 0xE000 <= cp <= 0xFFFD
        or 0x10000 <= cp <= 0x10FFFF
    )


def _code_point(body: str) -> int | None:
    try:
        return int(body[1:], 16) if body[0] in "xX" else int(body)
    except ValueError:
        return None


def _char_ref(m: re.Match[str]) -> str:
    cp = _code_point(m.group(1))
    return m.group(0) if cp is not None and _valid_code_point(cp) else ""


def join_surrogate_refs(text: str) -> str:
    """A high and a low surrogate written as two references (`&#55357;&#56832;`, what a
    dumper escaping UTF-16 units one by one writes for 😀) as the one reference to the
    character they encode (`&#128512;`); alone, each is an invalid code point and dropped."""
    out: list[str] = []
    pos = 0
    matches = list(_CHAR_REF.finditer(text))
    i = 0
    while i < len(matches) - 1:
        hi, lo = matches[i], matches[i + 1]
        high, low = _code_point(hi.group(1)), _code_point(lo.group(1))
        if (
            lo.start() == hi.end()
            and high is not None
            and low is not None
            and 0xD800 <= high <= 0xDBFF
            and 0xDC00 <= low <= 0xDFFF
        ):
            out.append(text[pos : hi.start()])
            out.append(f"&#{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)};")
            pos = lo.end()
            i += 2
        else:
            i += 1
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def clean_dump(text: str) -> str:
    """The dump's root element alone, without a declaration and without invalid characters.

    Returns "" when there is no element at all (an empty dump, or only a status line).
    """
    text = _INVALID_CHARS.sub("", text or "")
    text = _CHAR_REF.sub(_char_ref, join_surrogate_refs(text))
    start = text.find("<")
    if start < 0:
        return ""
    text = _DECLARATION.sub("", text[start:])
    start = text.find("<")
    if start < 0:
        return ""
    text = text[start:]
    m = _ROOT_NAME.match(text)
    if m is None:
        return text
    name = m.group(1)
    close = text.rfind(f"</{name}>")
    if close >= 0:
        return text[: close + len(name) + 3]
    head = re.match(rf"<{re.escape(name)}\b[^>]*/>", text)
    return head.group(0) if head else text


def repair_dump(text: str) -> tuple[str, str]:
    """`text` with the `&`, `<` and `"` its dumper left unescaped in attribute values escaped,
    and what was repaired ("" when nothing was: a well-formed dump has no such character).

    Bounded on purpose: only characters inside a double-quoted value change, so what a dump
    says is kept as it was. A raw `"` is told from the value's end by what follows it: the
    end is followed by another attribute or the tag's end, a quote inside a text ("Tap
    "Allow" to continue") is not; a text that itself reads like an attribute after a quote
    (`a" b="c`) cannot be told apart and is cut there, as any reader would."""
    if _MARKUP_IN_VALUE.search(text) is None and not _stray_quotes(text):
        return text, ""
    found = {"&": 0, "<": 0, '"': 0}

    def escape(m: re.Match[str]) -> str:
        raw = m.group(1)
        if not any(c in raw for c in found):
            return m.group(0)
        value = _BARE_AMP.sub("&amp;", raw)
        found["&"] += value.count("&amp;") - raw.count("&amp;")
        found["<"] += value.count("<")
        found['"'] += value.count('"')
        return '="' + value.replace("<", "&lt;").replace('"', "&quot;") + '"'

    repaired = _VALUE.sub(escape, text)
    count = sum(found.values())
    if not count:
        return text, ""
    named = "'&', '<' or '\"'" if found['"'] else "'&' or '<'"
    chars = "character" if count == 1 else "characters"
    return repaired, (
        f"the dump was not well-formed XML: {count} unescaped {named} {chars} in its texts, "
        "escaped to read it"
    )
